package shop_test

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/internal/obstest"
)

// shopd's payment secret comes from -pay-secret, else SHOPD_PAY_SECRET,
// else the development secret, which it warns about at startup. (Not
// parallel: it sets an environment variable.)
func TestRunPaySecret(t *testing.T) {
	for _, c := range []struct {
		name, env string
		args      []string
		want      string // the secret that signs accepted callbacks
		warns     bool
	}{
		{"flag over environment", "env-secret", []string{"-pay-secret", "flag-secret"}, "flag-secret", false},
		{"environment", "env-secret", nil, "env-secret", false},
		{"development default", "", nil, shop.DevPaySecret, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("SHOPD_PAY_SECRET", c.env)
			var stdout, stderr obstest.LogBuffer
			ctx, cancel := context.WithCancel(context.Background())
			args := append([]string{"-addr", "127.0.0.1:0", "-data", filepath.Join(t.TempDir(), "data")}, c.args...)
			done := make(chan error, 1)
			go func() { done <- shop.Run(ctx, args, &stdout, &stderr) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			base := waitFor(t, &stdout, regexp.MustCompile(`shopd listening on (\S+)`))[1]
			// A callback for an order the shop lacks: 404 ORDER_NOT_FOUND
			// once its signature is accepted, 401 before.
			body := []byte(`{"order_no":"ord_none","trade_no":"T-run","amount_cents":1,"status":"SUCCESS"}`)
			for _, secret := range []string{"flag-secret", "env-secret", shop.DevPaySecret} {
				req, _ := http.NewRequest("POST", base+"/payments/callback", bytes.NewReader(body))
				req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(secret, time.Now(), body))
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				want := http.StatusUnauthorized
				if secret == c.want {
					want = http.StatusNotFound
				}
				if resp.StatusCode != want {
					t.Errorf("signed with %s: %d, want %d", secret, resp.StatusCode, want)
				}
			}
			if warned := strings.Contains(stderr.String(), "development secret"); warned != c.warns {
				t.Errorf("warned about the development secret: %v, want %v; stderr:\n%s", warned, c.warns, stderr.String())
			}
			for _, secret := range []string{"flag-secret", "env-secret"} {
				if strings.Contains(stderr.String()+stdout.String(), secret) {
					t.Errorf("the output shows the secret %s", secret)
				}
			}
		})
	}
	t.Run("empty flag", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		err := shop.Run(context.Background(), []string{"-addr", "127.0.0.1:0", "-data", filepath.Join(t.TempDir(), "data"), "-pay-secret", ""}, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), "-pay-secret") {
			t.Fatalf("Run with an empty -pay-secret: %v", err)
		}
	})
}
