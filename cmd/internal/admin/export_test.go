package admin

import "net/http"

// Tracked is the number of clients whose failed logins h keeps.
func Tracked(h http.Handler) int {
	a := h.(*Handler)
	a.limit.mu.Lock()
	defer a.limit.mu.Unlock()
	return len(a.limit.clients)
}
