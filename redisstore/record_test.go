package redisstore

import (
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// FuzzDecodeRecord checks decodeRecord on any hash fields, as HMGET
// returns them: a record decodes exactly when its status is known and its
// numeric fields are integers (or absent), the retention one that a
// time.Duration holds; what decodes holds those
// integers, and written back as the scripts write it, decodes to the same
// record. A nil status is no record.
func FuzzDecodeRecord(f *testing.F) {
	f.Add("completed", "v1:ab", "own", "3", "1790000030123", "86400000", "1790000000123", "1790000001000", "1790086401000",
		"201", string(encodeHeader(map[string][]string{"Location": {"/a"}})), "\x00body", "0", false)
	f.Add("processing", "", "o", "1", "1", "1", "1", "", "2", "", "", "", "", false)
	f.Add("completed", "", "", "", "", "", "", "", "", "", "", "", "1", false)
	f.Add("completed", "", "", "x", "", "", "", "", "", "", "\x05ab", "", "", false)
	f.Add("", "", "", "", "", "", "", "", "", "", "", "", "", true)
	f.Add("done", "", "", "", "", "", "", "", "", "", "", "", "", false)
	f.Add("processing", "", "", "-0", "+1", "9223372036854775808", "", "", "", "", "", "", "", false)
	f.Fuzz(func(t *testing.T, status, fp, owner, fence, until, retention, created, completed, expires,
		code, header, body, omitted string, absent bool) {
		v := []any{status, fp, owner, fence, until, retention, created, completed, expires, code, header, body, omitted}
		if absent {
			v[0] = nil
		}
		rec, found, err := decodeRecord("s", "k", v)
		if absent {
			if found || err != nil {
				t.Fatalf("no status: found %v, %v", found, err)
			}
			return
		}
		isInt := func(s string) bool {
			_, err := strconv.ParseInt(s, 10, 64)
			return s == "" || err == nil
		}
		numbers := []string{fence, until, retention, created, completed, expires}
		_, headerErr := decodeHeader(header)
		valid := status == string(idem.StatusProcessing) || status == string(idem.StatusCompleted) && isInt(code) && headerErr == nil
		for _, n := range numbers {
			valid = valid && isInt(n)
		}
		// A retention a time.Duration cannot hold is refused.
		if r, _ := strconv.ParseInt(retention, 10, 64); r > math.MaxInt64/int64(time.Millisecond) || r < math.MinInt64/int64(time.Millisecond) {
			valid = false
		}
		if (err == nil) != valid || err == nil && !found {
			t.Fatalf("%q: found %v, error %v; want valid %v", v, found, err, valid)
		}
		if err != nil {
			return
		}
		num := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
		if rec.Fence != num(fence) || rec.Retention != time.Duration(num(retention))*time.Millisecond ||
			rec.Fingerprint != idem.Fingerprint(fp) || rec.Owner != owner || string(rec.Status) != status {
			t.Fatalf("%q decoded to %+v", v, rec)
		}
		for i, tm := range map[int]time.Time{1: rec.LeaseUntil, 3: rec.CreatedAt, 4: rec.CompletedAt, 5: rec.ExpiresAt} {
			if n := num(numbers[i]); tm.IsZero() != (n == 0) || n != 0 && tm.UnixMilli() != n {
				t.Fatalf("%q: time %d is %v", v, i, tm)
			}
		}
		if (rec.Response != nil) != (status == string(idem.StatusCompleted)) {
			t.Fatalf("%q: response %+v", v, rec.Response)
		}

		// Written back as the scripts write a record, it decodes alike.
		ms := func(tm time.Time) string {
			if tm.IsZero() {
				return ""
			}
			return strconv.FormatInt(tm.UnixMilli(), 10)
		}
		w := []any{string(rec.Status), string(rec.Fingerprint), rec.Owner, strconv.FormatInt(rec.Fence, 10), ms(rec.LeaseUntil),
			strconv.FormatInt(rec.Retention.Milliseconds(), 10), ms(rec.CreatedAt), ms(rec.CompletedAt), ms(rec.ExpiresAt), "", "", "", ""}
		if r := rec.Response; r != nil {
			w[9], w[10], w[11] = strconv.Itoa(r.StatusCode), string(encodeHeader(r.Header)), string(r.Body)
			if r.BodyOmitted {
				w[12] = "1"
			}
		}
		again, found, err := decodeRecord("s", "k", w)
		if err != nil || !found || !reflect.DeepEqual(again, rec) {
			t.Fatalf("%q decoded to\n%+v\nwritten back as %q, decodes to\n%+v, %v", v, rec, w, again, err)
		}
	})
}
