package cmdline

import "testing"

func TestHelpAsked(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"-h"}, true},
		{[]string{"-merge", "--help", "x"}, true},
		{[]string{"-help"}, true},
		{[]string{"--", "-h"}, false},
		{[]string{"help.yaml"}, false},
	} {
		if got := HelpAsked(tc.args); got != tc.want {
			t.Errorf("HelpAsked(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
