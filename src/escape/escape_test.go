package escape

import (
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"café", "café"},
		{"caf\xe9", `caf\xe9`},
		{`\xff`, `\\xff`},
		{"\xff", `\xff`},
		{`a\b`, `a\\b`},
		{"\xc3(", `\xc3(`},
		{"", ""},
	}
	for _, tc := range tests {
		if got := String(tc.in); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if back, ok := Unescape(String(tc.in)); !ok || back != tc.in {
			t.Errorf("Unescape(String(%q)) = %q, %v", tc.in, back, ok)
		}
	}
	// The pair that once shared a counter.
	if String(`\xff`) == String("\xff") {
		t.Error(`the text \xff and the byte 0xFF escape alike`)
	}
}

// FuzzString: String is one to one (Unescape undoes it) and its output is
// always valid UTF-8; two distinct inputs can never share an output.
func FuzzString(f *testing.F) {
	for _, s := range []string{"", "a", `\xff`, "\xff", `\\`, "\\\xfe", "é\xc3(", `\x4`, "\x00\\x00"} {
		f.Add(s, `\xff`)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := String(a), String(b)
		if back, ok := Unescape(ea); !ok || back != a {
			t.Fatalf("Unescape(String(%q)) = %q, %v", a, back, ok)
		}
		if a != b && ea == eb {
			t.Fatalf("String(%q) == String(%q) == %q", a, b, ea)
		}
		if !utf8.ValidString(ea) {
			t.Fatalf("String(%q) = %q is not UTF-8", a, ea)
		}
	})
}
