package fail

import "testing"

func TestFails(t *testing.T) { t.Error("broken on purpose") }
