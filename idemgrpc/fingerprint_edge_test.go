package idemgrpc_test

import (
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem/idemgrpc"
)

// FingerprintV1 is over the encoding's bytes, not the values' meaning:
// pinned here as the package documentation states it. -0.0 and 0.0 are
// two requests (a proto3 double of -0.0 is encoded, 0.0 is not); one NaN
// is one request whatever its retries, since a retry resends its bits;
// unknown fields count.
func TestFingerprintEdges(t *testing.T) {
	t.Parallel()
	const method = "/shop.Orders/Create"
	fp := func(m proto.Message) string {
		t.Helper()
		f, err := idemgrpc.FingerprintV1(method, m)
		if err != nil {
			t.Fatal(err)
		}
		return string(f)
	}
	if fp(wrapperspb.Double(math.Copysign(0, -1))) == fp(wrapperspb.Double(0)) {
		t.Error("-0.0 and 0.0 have one fingerprint; the documentation says two")
	}
	if fp(wrapperspb.Double(math.NaN())) != fp(wrapperspb.Double(math.NaN())) {
		t.Error("the same NaN has two fingerprints")
	}
	withUnknown := func(v string) proto.Message {
		m := wrapperspb.String(v)
		var b []byte
		b = protowire.AppendTag(b, 9, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
		m.ProtoReflect().SetUnknown(b)
		return m
	}
	if fp(withUnknown("a")) != fp(withUnknown("a")) || fp(withUnknown("a")) == fp(wrapperspb.String("a")) {
		t.Error("unknown fields: want one fingerprint for equal bytes and another without them")
	}
}
