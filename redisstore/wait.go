package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// configureWait validates Config.WaitReplicas and WaitTimeout and finds
// how to reach the primary of a key.
func (s *Store) configureWait(n int, timeout time.Duration) error {
	switch {
	case n < 0:
		return fmt.Errorf("redisstore: Config.WaitReplicas must not be negative, got %d", n)
	case timeout < 0:
		return fmt.Errorf("redisstore: Config.WaitTimeout must not be negative, got %v", timeout)
	case n == 0:
		return nil
	case timeout == 0:
		timeout = DefaultWaitTimeout
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		s.primary = c.MasterForKey
	case *redis.Client:
		s.primary = func(context.Context, string) (*redis.Client, error) { return c, nil }
	default:
		return fmt.Errorf("redisstore: Config.WaitReplicas needs a *redis.Client or *redis.ClusterClient, got %T", s.client)
	}
	// WAIT takes whole milliseconds, and WAIT n 0 blocks without bound:
	// round up, so that a timeout under a millisecond still bounds it.
	s.waitN, s.waitTimeout = n, timeout.Truncate(time.Millisecond)
	if s.waitTimeout < timeout {
		s.waitTimeout += time.Millisecond
	}
	return nil
}

// run runs script on key as Script.Run does (EVALSHA, then EVAL after
// NOSCRIPT). With Config.WaitReplicas it sends WAIT after the script on
// the same connection, in one pipeline, and short reports, wrapping
// ErrNotReplicated, that the script ran but too few replicas acknowledged
// it (or that WAIT's answer was lost). short is meaningful only when
// cmd.Err() is nil.
func (s *Store) run(ctx context.Context, script *redis.Script, key string, args ...any) (cmd *redis.Cmd, short error) {
	keys := []string{key}
	if s.waitN == 0 {
		return script.Run(ctx, s.client, keys, args...), nil
	}
	node, err := s.primary(ctx, key)
	if err != nil {
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd, nil
	}
	for _, eval := range []bool{false, true} {
		pipe := node.Pipeline()
		if eval {
			cmd = script.Eval(ctx, pipe, keys, args...)
		} else {
			cmd = script.EvalSha(ctx, pipe, keys, args...)
		}
		wait := pipe.Do(ctx, "wait", s.waitN, s.waitTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if err := cmd.Err(); err != nil {
			if !eval && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
				continue
			}
			return cmd, nil
		}
		got, err := wait.Int64()
		switch {
		case err != nil:
			return cmd, fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
		case got < int64(s.waitN):
			return cmd, fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, got, s.waitN, s.waitTimeout)
		}
		return cmd, nil
	}
	return cmd, nil
}
