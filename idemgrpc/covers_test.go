package idemgrpc_test

import (
	"testing"

	"github.com/idemkit/idem/idemgrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	_ "google.golang.org/protobuf/types/known/emptypb" // registers google/protobuf/empty.proto
)

// TestDefaultCovers: a registered method declared NO_SIDE_EFFECTS or
// IDEMPOTENT is left out, as is the health service; an undeclared one,
// and one the registry does not know, are covered.
func TestDefaultCovers(t *testing.T) {
	level := func(l descriptorpb.MethodOptions_IdempotencyLevel) *descriptorpb.MethodOptions {
		return &descriptorpb.MethodOptions{IdempotencyLevel: l.Enum()}
	}
	method := func(name string, opts *descriptorpb.MethodOptions) *descriptorpb.MethodDescriptorProto {
		return &descriptorpb.MethodDescriptorProto{Name: proto.String(name),
			InputType: proto.String(".google.protobuf.Empty"), OutputType: proto.String(".google.protobuf.Empty"), Options: opts}
	}
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("idemgrpc_test/covers.proto"),
		Package:    proto.String("idemgrpc.covers"),
		Syntax:     proto.String("proto3"),
		Dependency: []string{"google/protobuf/empty.proto"},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Shop"),
			Method: []*descriptorpb.MethodDescriptorProto{
				method("Get", level(descriptorpb.MethodOptions_NO_SIDE_EFFECTS)),
				method("Put", level(descriptorpb.MethodOptions_IDEMPOTENT)),
				method("Pay", nil),
			},
		}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
		t.Fatal(err)
	}
	for method, want := range map[string]bool{
		"/idemgrpc.covers.Shop/Get":    false,
		"/idemgrpc.covers.Shop/Put":    false,
		"/idemgrpc.covers.Shop/Pay":    true,
		"/grpc.health.v1.Health/Check": false,
		methodCreate:                   true, // not registered
		"malformed":                    true,
	} {
		if got := idemgrpc.DefaultCovers(method); got != want {
			t.Errorf("DefaultCovers(%q) = %v, want %v", method, got, want)
		}
	}
}
