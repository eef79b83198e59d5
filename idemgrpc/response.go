package idemgrpc

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// fingerprintV1Domain starts the hashed input of FingerprintV1.
const fingerprintV1Domain = "idemgrpc-fingerprint-v1\n"

// deterministic encodes a request for its fingerprint: map entries sorted
// by key, so equal messages encode equally in one binary.
var deterministic = proto.MarshalOptions{Deterministic: true}

// FingerprintV1 is the default fingerprint: "g1:" followed by the
// lower-case hex SHA-256 of
//
//	"idemgrpc-fingerprint-v1\n"
//	len(fullMethod) fullMethod          lengths as 8-byte big-endian integers
//	len(body) body
//
// where body is the deterministic protobuf encoding of req
// (proto.MarshalOptions{Deterministic: true}): map fields in key order,
// so two requests equal in content (a google.protobuf.Struct whose fields
// were set in another order) have one fingerprint. Unknown fields are
// part of it, as received. The protobuf documentation does not promise
// that the deterministic encoding stays the same across versions of the
// protobuf module: a server upgraded between a call and its retry could,
// in principle, refuse the retry as another request (FailedPrecondition);
// it never replays one request's answer to another.
//
// A request that is not a proto.Message (a server with a codec of its
// own) is refused: set Config.Fingerprint for it.
func FingerprintV1(fullMethod string, req any) (idem.Fingerprint, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", fmt.Errorf("idemgrpc: request %T is not a proto.Message", req)
	}
	body, err := deterministic.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("idemgrpc: cannot encode the request: %w", err)
	}
	h := sha256.New()
	var n [8]byte
	h.Write([]byte(fingerprintV1Domain))
	binary.BigEndian.PutUint64(n[:], uint64(len(fullMethod)))
	h.Write(n[:])
	h.Write([]byte(fullMethod))
	binary.BigEndian.PutUint64(n[:], uint64(len(body)))
	h.Write(n[:])
	h.Write(body)
	var sum [sha256.Size]byte
	return idem.Fingerprint("g1:" + hex.EncodeToString(h.Sum(sum[:0]))), nil
}

// headerMessageType names, in a stored idem.Response, the full name of
// the stored message's type.
const headerMessageType = "Grpc-Message-Type"

// EncodeMessage returns the idem.Response a record keeps for a call
// answered with m: StatusCode codes.OK (0), the header Grpc-Message-Type
// holding m's full type name, and m's protobuf encoding as the body. The
// interceptor stores answers so itself; a handler that completes its
// execution in its own transaction (idem.FromContext(ctx).CompleteTx)
// passes what EncodeMessage returns, and retries replay m.
func EncodeMessage(m proto.Message) (idem.Response, error) {
	if m == nil {
		return idem.Response{}, errors.New("idemgrpc: nil message")
	}
	body, err := proto.Marshal(m)
	if err != nil {
		return idem.Response{}, fmt.Errorf("idemgrpc: cannot encode the response: %w", err)
	}
	name := string(m.ProtoReflect().Descriptor().FullName())
	return idem.Response{
		StatusCode: int(codes.OK),
		Header:     map[string][]string{headerMessageType: {name}},
		Body:       body,
	}, nil
}

// EncodeStatus returns the idem.Response a record keeps for a call
// answered with st (not OK): StatusCode the code, and as the body the
// google.rpc.Status encoding of st, with its message and details.
func EncodeStatus(st *status.Status) (idem.Response, error) {
	if st.Code() == codes.OK {
		return idem.Response{}, errors.New("idemgrpc: EncodeStatus of an OK status; use EncodeMessage")
	}
	body, err := proto.Marshal(st.Proto())
	if err != nil {
		return idem.Response{}, fmt.Errorf("idemgrpc: cannot encode the status: %w", err)
	}
	return idem.Response{StatusCode: int(st.Code()), Body: body}, nil
}

// decode returns the answer a stored response replays: the message (for
// OK) or the status error. An error of its own (the second) means the
// record cannot be replayed by this server.
func decode(resp idem.Response, types protoregistry.MessageTypeResolver) (any, error, error) {
	if resp.BodyOmitted {
		return nil, nil, errors.New("the stored answer has no body")
	}
	if resp.StatusCode != int(codes.OK) {
		if resp.StatusCode < 0 || resp.StatusCode > 16 {
			return nil, nil, fmt.Errorf("stored status %d is not a gRPC code", resp.StatusCode)
		}
		var sp spb.Status
		if err := proto.Unmarshal(resp.Body, &sp); err != nil {
			return nil, nil, fmt.Errorf("stored status: %w", err)
		}
		if sp.Code != int32(resp.StatusCode) {
			return nil, nil, fmt.Errorf("stored status has code %d, its record %d", sp.Code, resp.StatusCode)
		}
		return nil, status.FromProto(&sp).Err(), nil
	}
	names := resp.Header[headerMessageType]
	if len(names) != 1 {
		return nil, nil, errors.New("the stored answer names no message type")
	}
	mt, err := types.FindMessageByName(protoreflect.FullName(names[0]))
	if err != nil {
		return nil, nil, fmt.Errorf("stored message type %s: %w", names[0], err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(resp.Body, m); err != nil {
		return nil, nil, fmt.Errorf("stored message of type %s: %w", names[0], err)
	}
	return m, nil, nil
}
