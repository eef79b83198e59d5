package idemgrpc_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// FuzzMetadataKey sends calls whose idempotency-key metadata holds n
// values (0, 1 or 2) of any text: the handler runs exactly when there is
// one value that idemhttp.ParseKey accepts, and the record is stored
// under the key ParseKey returns; every other call is refused with
// InvalidArgument and never reaches the handler. A retry with the same
// metadata and request is replayed (the handler does not run again, the
// answer is the first one); with the same key and another request it is
// refused with FailedPrecondition.
func FuzzMetadataKey(f *testing.F) {
	for _, s := range []string{"order-1", `"order-1"`, `"a\"b"`, " k ", "", "\x00", "\xff", `"`, `"k";p=1`} {
		f.Add(uint8(1), s, "", "book")
	}
	f.Add(uint8(2), "a", "a", "book")
	f.Add(uint8(0), "", "", "")
	f.Fuzz(func(t *testing.T, n uint8, v1, v2, itemName string) {
		// A proto string is UTF-8: gRPC delivers no other request.
		itemName = strings.ToValidUTF8(itemName, "?")
		store := memstore.New(nil)
		icpt, err := idemgrpc.New(&idemgrpc.Config{Store: store})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		handler := func(ctx context.Context, req any) (any, error) {
			runs++
			return &structpb.Struct{Fields: map[string]*structpb.Value{
				"run": structpb.NewNumberValue(float64(runs)), "item": req.(*structpb.Struct).GetFields()["item"]}}, nil
		}
		values := []string{v1, v2}[:n%3]
		call := func(item string) (any, error) {
			md := metadata.MD{}
			if len(values) > 0 {
				md[idemgrpc.MetadataKey] = values
			}
			ctx := grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(context.Background(), md), nopStream{})
			req := &structpb.Struct{Fields: map[string]*structpb.Value{"item": structpb.NewStringValue(item)}}
			return icpt.Unary(ctx, req, &grpc.UnaryServerInfo{FullMethod: methodCreate}, handler)
		}
		first, err := call(itemName)
		key, keyErr := "", error(nil)
		if len(values) == 1 {
			key, keyErr = idemhttp.ParseKey(values[0])
		}
		if len(values) != 1 || keyErr != nil {
			if status.Code(err) != codes.InvalidArgument || runs != 0 {
				t.Fatalf("metadata %q: %v, %d runs; want InvalidArgument and no run", values, err, runs)
			}
			return
		}
		if err != nil || runs != 1 {
			t.Fatalf("key %q: %v, %d runs", values[0], err, runs)
		}
		if rec, err := store.Get(context.Background(), "", key); err != nil || rec.Response == nil {
			t.Fatalf("key %q (ParseKey: %q): record %+v, %v", values[0], key, rec, err)
		}
		again, err := call(itemName)
		if err != nil || runs != 1 || !proto.Equal(again.(proto.Message), first.(proto.Message)) {
			t.Fatalf("retry of %q: %v, %v, %d runs; want %v replayed", values[0], again, err, runs, first)
		}
		if _, err := call(itemName + "x"); status.Code(err) != codes.FailedPrecondition || runs != 1 {
			t.Fatalf("key %q with another request: %v, %d runs", values[0], err, runs)
		}
	})
}
