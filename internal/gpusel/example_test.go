package gpusel_test

import (
	"errors"
	"fmt"

	"github.com/mpsd/mpsd/internal/gpusel"
)

func Example() {
	inv := []gpusel.GPU{
		{Index: 0, UUID: "GPU-aaaa1111-0000-0000-0000-000000000000"},
		{Index: 1, UUID: "GPU-aaaa2222-0000-0000-0000-000000000000"},
		{Index: 2, UUID: "GPU-bbbb3333-0000-0000-0000-000000000000"},
	}
	sels, err := gpusel.ParseList([]string{"2", "GPU-aaaa1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	pos, err := gpusel.Resolve(inv, sels)
	fmt.Println(pos, err)

	sels, _ = gpusel.ParseList([]string{"aaaa", "7"})
	_, err = gpusel.Resolve(inv, sels)
	var es gpusel.Errors
	if errors.As(err, &es) {
		for _, e := range es {
			fmt.Printf("entry %d %q: ambiguous=%v: %s\n", e.Pos, e.Entry, errors.Is(e, gpusel.ErrAmbiguous), e.Reason)
		}
	}
	// Output:
	// [0 2] <nil>
	// entry 0 "aaaa": ambiguous=true: matches GPU 0 (GPU-aaaa1111-0000-0000-0000-000000000000), GPU 1 (GPU-aaaa2222-0000-0000-0000-000000000000)
	// entry 1 "7": ambiguous=false: no GPU with index 7 (this host has 3 GPUs)
}
