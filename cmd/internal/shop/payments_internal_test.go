package shop

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParsePaySignature(t *testing.T) {
	t.Parallel()
	a := strings.Repeat("ab", sha256.Size)
	b := strings.Repeat("CD", sha256.Size)
	for _, c := range []struct {
		name, header string
		unix         int64
		v1           []string // hex, lower case
	}{
		{"plain", "t=1700000000,v1=" + a, 1700000000, []string{a}},
		{"spaces", " t=1700000000 , v1=" + a + " ", 1700000000, []string{a}},
		{"rotation", "t=1,v1=" + a + ",v1=" + b, 1, []string{a, strings.ToLower(b)}},
		{"unknown parts ignored", "v0=zz,t=5,scheme=x,,noequals,v1=" + a, 5, []string{a}},
		{"malformed v1 skipped", "t=5,v1=abc,v1=" + strings.Repeat("zz", sha256.Size) + ",v1=" + a, 5, []string{a}},
		{"leading zeros", "t=0005,v1=" + a, 5, []string{a}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sig, err := parsePaySignature(c.header)
			if err != nil {
				t.Fatal(err)
			}
			if sig.unix != c.unix || len(sig.v1) != len(c.v1) {
				t.Fatalf("got t=%d and %d v1, want t=%d and %d", sig.unix, len(sig.v1), c.unix, len(c.v1))
			}
			for i, v := range sig.v1 {
				if hex.EncodeToString(v) != c.v1[i] {
					t.Errorf("v1[%d] = %x, want %s", i, v, c.v1[i])
				}
			}
		})
	}
	for _, h := range []string{
		"",
		"t=1",
		"v1=" + a,
		"t=,v1=" + a,
		"t=1,t=1,v1=" + a,
		"t=-1,v1=" + a,
		"t=+1,v1=" + a,
		"t=1.5,v1=" + a,
		"t=1e9,v1=" + a,
		"t=1234567890123,v1=" + a,
		"t=1,v1=" + a[:63],
		"t=1,v1=" + a + "00",
		"t=1,v1=" + a + strings.Repeat(",x", maxPaySignature),
	} {
		if _, err := parsePaySignature(h); !errors.Is(err, errBadSignature) {
			t.Errorf("parsePaySignature(%.80q) = %v, want a bad signature", h, err)
		}
	}
}

func TestVerifyPaySignature(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	body := []byte(`{"order_no":"ord_1","trade_no":"T1","amount_cents":1299,"status":"SUCCESS"}`)
	good := SignPayment("s3cret", now, body)
	old := SignPayment("old-secret", now, body)
	ts := strconv.FormatInt(now.Unix(), 10)
	for _, c := range []struct {
		name   string
		values []string
		at     time.Time
		ok     bool
	}{
		{"good", []string{good}, now, true},
		{"rotation: the new among others", []string{old + "," + strings.TrimPrefix(good, "t="+ts+",")}, now, true},
		{"rotation: none matches", []string{old}, now, false},
		{"at the tolerance's edge, past", []string{good}, now.Add(PaySignatureTolerance), true},
		{"at the tolerance's edge, future", []string{good}, now.Add(-PaySignatureTolerance), true},
		{"expired", []string{good}, now.Add(PaySignatureTolerance + time.Second), false},
		{"from the future", []string{good}, now.Add(-PaySignatureTolerance - time.Second), false},
		{"missing", nil, now, false},
		{"two fields", []string{good, good}, now, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := verifyPaySignature(c.values, body, "s3cret", c.at)
			if c.ok != (err == nil) {
				t.Fatalf("verify = %v, want ok=%v", err, c.ok)
			}
			if err != nil && !errors.Is(err, errBadSignature) {
				t.Fatalf("error %v is not a bad signature", err)
			}
		})
	}
	if err := verifyPaySignature([]string{good}, append(body, ' '), "s3cret", now); err == nil {
		t.Error("a changed body verified")
	}
}

// parsePaySignature never panics, refuses only with errBadSignature, and
// what it accepts is a timestamp of digits and v1 values of 32 bytes; a
// header SignPayment writes verifies.
func FuzzParsePaySignature(f *testing.F) {
	a := strings.Repeat("ab", sha256.Size)
	for _, seed := range []string{
		"t=1700000000,v1=" + a,
		"t=1,v1=" + a + ",v1=" + a,
		"v0=x,t=2, v1=" + a,
		"t=1,t=2,v1=" + a,
		"t=99999999999999999999,v1=" + a,
		",,,=,t=,v1=",
		"t=1,v1=" + strings.ToUpper(a),
	} {
		f.Add(seed, []byte("{}"), int64(1700000000))
	}
	f.Fuzz(func(t *testing.T, header string, body []byte, unix int64) {
		sig, err := parsePaySignature(header)
		if err != nil {
			if !errors.Is(err, errBadSignature) {
				t.Fatalf("error %v is not a bad signature", err)
			}
		} else {
			if sig.timestamp == "" || strings.Trim(sig.timestamp, "0123456789") != "" || len(sig.v1) == 0 {
				t.Fatalf("accepted %q as t=%q with %d v1", header, sig.timestamp, len(sig.v1))
			}
			for _, v := range sig.v1 {
				if len(v) != sha256.Size {
					t.Fatalf("v1 of %d bytes", len(v))
				}
			}
		}
		if unix < 0 || unix > 1e11 {
			return
		}
		at := time.Unix(unix, 0)
		if err := verifyPaySignature([]string{SignPayment("k", at, body)}, body, "k", at); err != nil {
			t.Fatalf("SignPayment's header does not verify: %v", err)
		}
	})
}

// BenchmarkVerifyPaySignature: parsing the header and checking the
// signature, next to its baseline, the bare HMAC-SHA256 of the payload.
func BenchmarkVerifyPaySignature(b *testing.B) {
	body := []byte(`{"order_no":"ord_3cfb2a10478763a39cbc324b","trade_no":"T-1001","amount_cents":5000,"status":"SUCCESS"}`)
	now := time.Now()
	header := []string{SignPayment("s3cret", now, body)}
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := verifyPaySignature(header, body, "s3cret", now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-hmac", func(b *testing.B) {
		b.ReportAllocs()
		ts := strconv.FormatInt(now.Unix(), 10)
		for b.Loop() {
			paySignature("s3cret", ts, body)
		}
	})
}
