package units_test

import (
	"fmt"

	"github.com/mpsd/mpsd/internal/units"
)

func ExampleParseSize() {
	for _, s := range []string{"8G", "8GiB", "1.5G", "512M", "1024"} {
		n, err := units.ParseSize(s)
		fmt.Println(s, n, err)
	}
	// Output:
	// 8G 8589934592 <nil>
	// 8GiB 8589934592 <nil>
	// 1.5G 1610612736 <nil>
	// 512M 536870912 <nil>
	// 1024 1024 <nil>
}

func ExampleMPSLimit() {
	s, err := units.MPSLimit(8 * units.GiB)
	fmt.Println(s, err, units.FormatSize(8*units.GiB))
	// Output: 8192M <nil> 8G
}
