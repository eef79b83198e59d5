package natsjs

import (
	"errors"
	"strings"
)

// SubjectMatches reports whether the NATS subject matches pattern, token
// by token ('.'-separated): '*' matches one token, '>' (last) one or more.
func SubjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">" && i == len(p)-1:
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}

// literalSubject reports whether s is a subject a message can be
// published on: non-empty tokens, no wildcard, no space.
func literalSubject(s string) error {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return errors.New("empty or has a space: " + s)
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return errors.New("not a literal subject (empty token or wildcard): " + s)
		}
	}
	return nil
}
