package cli

import "testing"

func TestExpandPattern(t *testing.T) {
	cases := []struct {
		pattern string
		frame   int
		want    string
	}{
		{"out/shot_####.png", 7, "out/shot_0007.png"},
		{"out/shot_####.png", 12345, "out/shot_12345.png"},
		{"f#.exr", 3, "f3.exr"},
		{"f#.exr", 0, "f0.exr"},
		{"a_##/b_######.png", 42, "a_42/b_000042.png"},
		{"still.png", 9, "still.png"},
		{"####", 1, "0001"},
	}
	for _, c := range cases {
		got, err := expandPattern(c.pattern, c.frame)
		if err != nil || got != c.want {
			t.Errorf("ExpandPattern(%q, %d) = %q, %v; want %q", c.pattern, c.frame, got, err, c.want)
		}
	}
	if _, err := expandPattern("", 1); err == nil {
		t.Error("empty pattern accepted")
	}
	if _, err := expandPattern("x_##.png", -1); err == nil {
		t.Error("negative frame accepted")
	}
}
