package natsjs

import "testing"

func TestTermReasonSupported(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{
		"2.9.10": false, "2.10.3": false, "2.10.4": true, "2.10.22": true, "2.11.0": true,
		"v2.12.1-beta.2": true, "3.0.0": true, "1.4.1": false, "": false, "garbage": false,
	} {
		if got := termReasonSupported(v); got != want {
			t.Errorf("termReasonSupported(%q) = %v, want %v", v, got, want)
		}
	}
}
