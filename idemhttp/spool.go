package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"os"

	"github.com/idemkit/idem"
)

// spoolChunk is the size of the buffer a body is spooled through.
const spoolChunk = 64 << 10

// requestBody is a guarded request's body as the middleware read it: in
// memory (mem), and, with Config.SpoolBody, whatever followed in a
// temporary file.
type requestBody struct {
	mem   []byte
	spool *spool // nil: mem is the whole body
}

// size is the body's length in bytes.
func (b requestBody) size() int64 {
	n := int64(len(b.mem))
	if b.spool != nil {
		n += b.spool.size
	}
	return n
}

// spool is the part of a body after the bytes held in memory, in a
// temporary file.
type spool struct {
	file *os.File
	name string // the file's name, when it could not be unlinked while open: removed by close
	size int64  // bytes in file
	fp   idem.Fingerprint
}

// close closes the file (and removes it, if it could not be unlinked when
// it was created).
func (s *spool) close() {
	_ = s.file.Close()
	if s.name != "" {
		_ = os.Remove(s.name)
	}
}

// spoolError is a spool file that cannot be created, written or read.
type spoolError struct{ err error }

func (e *spoolError) Error() string {
	return "idemhttp: cannot spool the request body: " + e.err.Error()
}
func (e *spoolError) Unwrap() error { return e.err }

// readRequestBody reads r's body: into buf, refusing more than
// MaxRequestBody bytes; with SpoolBody, a larger body is spooled up to
// MaxStreamedBody bytes. On an error the body holds no spool and mem is
// buf emptied.
func (m *Middleware) readRequestBody(r *http.Request, buf []byte) (requestBody, error) {
	if m.maxStreamed == 0 {
		mem, err := readBody(r, m.maxReq, buf)
		return requestBody{mem: mem}, err
	}
	if r.ContentLength > m.maxStreamed {
		return requestBody{mem: buf[:0]}, errBodyTooLarge
	}
	mem, err := readAtMost(r, m.maxReq, buf)
	switch {
	case err == nil:
		return requestBody{mem: mem}, nil
	case !errors.Is(err, errBodyTooLarge):
		return requestBody{mem: mem[:0]}, err
	}
	sp, err := m.spool(r, mem)
	if err != nil {
		return requestBody{mem: mem[:0]}, err
	}
	return requestBody{mem: mem, spool: sp}, nil
}

// spool writes the rest of r's body, after mem (which has been read from
// it), to a temporary file, and fingerprints the whole body as raw bytes.
func (m *Middleware) spool(r *http.Request, mem []byte) (*spool, error) {
	f, err := os.CreateTemp(m.spoolDir, "idemhttp-body-*")
	if err != nil {
		return nil, &spoolError{err}
	}
	s := &spool{file: f}
	// Unlinked while open (Unix): the file is gone with its descriptor,
	// whenever and however the process ends. Where an open file cannot
	// be removed (Windows), close removes it.
	if err := os.Remove(f.Name()); err != nil {
		s.name = f.Name()
	}
	if err := s.fill(r, mem, m.maxStreamed); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// fill spools the rest of r's body (mem has been read from it), refusing
// a body over limit bytes, and sets s.fp to its fingerprint: FingerprintV1
// of r with the body as raw bytes. Its hashed input gives the body's length
// before its bytes: when r announced its length (Content-Length), the body
// is hashed as it is spooled, else (or if the length was not the one
// announced) in a second pass over the spool.
func (s *spool) fill(r *http.Request, mem []byte, limit int64) error {
	total := int64(len(mem))
	announced := r.ContentLength
	h := sha256.New()
	hashing := announced >= total
	if hashing {
		h.Write(rawBodyHead(r, announced))
		h.Write(mem)
	}
	buf := make([]byte, spoolChunk)
	for {
		n, err := readFull(r.Body, buf)
		if n > 0 {
			total += int64(n)
			if total > limit {
				return errBodyTooLarge
			}
			if hashing {
				h.Write(buf[:n])
			}
			if _, werr := s.file.Write(buf[:n]); werr != nil {
				return &spoolError{werr}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	s.size = total - int64(len(mem))
	if !hashing || total != announced {
		h.Reset()
		h.Write(rawBodyHead(r, total))
		h.Write(mem)
		if _, err := io.CopyBuffer(h, io.NewSectionReader(s.file, 0, s.size), buf); err != nil {
			return &spoolError{err}
		}
	}
	s.fp = fingerprintV1Of(h.Sum(nil))
	return nil
}

// readFull reads into buf until it is full, the reader ends (io.EOF) or
// fails; unlike io.ReadFull it returns the reader's own error, so that a
// truncated body (io.ErrUnexpectedEOF) is told from its end.
func readFull(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// spoolReader is the body a handler reads when the request was read with
// SpoolBody: the bytes in memory, then those in the spool file.
type spoolReader struct {
	mem  bytes.Reader
	file io.SectionReader
}

func (r *spoolReader) Read(p []byte) (int, error) {
	if r.mem.Len() > 0 {
		return r.mem.Read(p)
	}
	return r.file.Read(p)
}

// Close does nothing: the middleware closes the spool when the request
// ends.
func (*spoolReader) Close() error { return nil }

// set makes the reader read b from its start; reset it when the handler
// returns.
func (r *spoolReader) set(b requestBody) {
	r.mem.Reset(b.mem)
	if b.spool != nil {
		r.file = *io.NewSectionReader(b.spool.file, 0, b.spool.size)
	} else {
		r.file = io.SectionReader{}
	}
}

// reset makes the reader empty: reads after the handler returned see the
// end of the body, never a closed file.
func (r *spoolReader) reset() {
	r.mem.Reset(nil)
	r.file = io.SectionReader{}
}
