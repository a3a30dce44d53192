package central

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/julienschmidt/httprouter"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/channel/webpush"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/egress"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
)

// devicesJSON is the caller's devices.
type devicesJSON struct {
	Data []devices.Device `json:"data"`
}

func (s *Server) putDevice(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	var body struct {
		Token    string `json:"token"`
		Platform string `json:"platform"`
		// Provider reaches the device: expo (the default for ios and
		// android), webpush (for web), or a channel set up here (apns, fcm).
		Provider string `json:"provider"`
		// Subscription is a browser's PushSubscription.toJSON(), for platform web.
		Subscription json.RawMessage `json:"subscription"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	var sub webpush.Subscription
	direct := body.Provider != "" && body.Provider != push.ProviderExpo && body.Provider != push.ProviderWebPush
	switch {
	case body.Provider == push.ProviderWebPush && body.Platform != devices.Web,
		body.Provider == push.ProviderExpo && body.Platform == devices.Web:
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "provider webpush is for platform web, and platform web is reached by webpush only").On("provider"))
		return
	case direct && body.Platform == devices.Web:
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "platform web is reached by webpush only").On("provider"))
		return
	case direct && len(body.Subscription) > 0:
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "a subscription is for platform web").On("subscription"))
		return
	case body.Platform != devices.IOS && body.Platform != devices.Android && body.Platform != devices.Web:
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "platform must be ios, android or web").On("platform"))
		return
	case body.Platform == devices.Web && body.Token != "":
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "a web device is registered by its subscription, not a token").On("token"))
		return
	case body.Platform == devices.Web && s.cfg.VAPIDPublicKey == "":
		// Its pushes could only fail, and it would count against the
		// user's devices.
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "platform web: Web Push is not set up on this deployment (--vapid-key-file)").On("platform"))
		return
	case body.Platform == devices.Web:
		var err error
		if sub, err = webpush.ParseSubscription(body.Subscription); err != nil {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidPushToken, err.Error()).On("subscription"))
			return
		}
		if !s.cfg.WebPushAllowPrivate {
			if err := egress.CheckHost(r.Context(), sub.Endpoint); err != nil {
				problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidPushToken, "subscription: endpoint: "+err.Error()).On("subscription"))
				return
			}
		}
	case len(body.Subscription) > 0:
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "a subscription is for platform web").On("subscription"))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	var dev devices.Device
	var err error
	switch {
	case body.Platform == devices.Web:
		dev, err = s.cfg.Devices.RegisterWeb(ctx, u.ID, sub)
	case direct:
		dev, err = s.cfg.Devices.RegisterWith(ctx, u.ID, body.Provider, body.Token, body.Platform)
	default:
		dev, err = s.cfg.Devices.Register(ctx, u.ID, body.Token, body.Platform)
	}
	switch {
	case errors.Is(err, devices.ErrProviderNotSetUp):
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, fmt.Sprintf("provider %q is not set up on this deployment", body.Provider)).On("provider"))
	case errors.Is(err, devices.ErrPlatform):
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, err.Error()).On("platform"))
	case errors.Is(err, devices.ErrInvalidToken), errors.Is(err, devices.ErrProviderToken):
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidPushToken, err.Error()).On("token"))
	case err != nil:
		s.dbError(w, r, "register device", err)
	default:
		httpapi.WriteJSON(w, http.StatusOK, dev)
	}
}

func (s *Server) deleteDevice(w http.ResponseWriter, r *http.Request, ps httprouter.Params, u auth.User) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	switch err := s.cfg.Devices.Disable(ctx, u.ID, ps.ByName("token")); {
	case errors.Is(err, devices.ErrNoDevice):
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "no such device"))
	case err != nil:
		s.dbError(w, r, "disable device", err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) listDevices(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	devs, err := s.cfg.Devices.List(ctx, u.ID)
	if err != nil {
		s.dbError(w, r, "list devices", err)
		return
	}
	if devs == nil {
		devs = []devices.Device{}
	}
	httpapi.WriteJSON(w, http.StatusOK, devicesJSON{Data: devs})
}

// preferencesElsewhere answers the preference routes of a deployment whose
// preferences live in the product's own API (--prefs-url).
func (s *Server) preferencesElsewhere(w http.ResponseWriter, r *http.Request) bool {
	if !s.cfg.PreferencesExternal {
		return false
	}
	problem.Write(w, r, problem.New(http.StatusNotFound, problem.PreferencesExternal,
		"this deployment reads push preferences from the product's own API; change them there"))
	return true
}

func (s *Server) getPreferences(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	if s.preferencesElsewhere(w, r) {
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	doc, err := s.cfg.Preferences.Get(ctx, u.ID)
	if err != nil {
		s.dbError(w, r, "read preferences", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, doc)
}

func (s *Server) putPreferences(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	if s.preferencesElsewhere(w, r) {
		return
	}
	var doc preferences.Update
	if !readJSON(w, r, &doc) {
		return
	}
	for c := range doc.Categories {
		if c == "" || len(c) > 128 {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "a category is 1 to 128 bytes").On("categories"))
			return
		}
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	merged, err := s.cfg.Preferences.Merge(ctx, u.ID, doc)
	if err != nil {
		s.dbError(w, r, "save preferences", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, merged)
}

// listDeliveries is the delivery log, for admins: dispatches newest first.
func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request, _ httprouter.Params, _ auth.User) {
	query := r.URL.Query()
	q := push.DeliveryQuery{UserID: query.Get("user"), State: query.Get("state"), Cursor: query.Get("cursor")}
	bad := func(field, detail string) {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidQuery, detail).On(field))
	}
	if v := query.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > push.MaxDeliveriesLimit {
			bad("limit", "limit must be a whole number from 1 to "+strconv.Itoa(push.MaxDeliveriesLimit))
			return
		}
		q.Limit = n
	}
	if q.State != "" && !slices.Contains(push.States, q.State) {
		bad("state", "state must be one of "+strings.Join(push.States, ", "))
		return
	}
	if err := q.Validate(); errors.Is(err, push.ErrBadCursor) {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor, "cursor is not one this server issued; start again without it").On("cursor"))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	var page push.DeliveryPage
	// The log is not a user's feed: only a position the admin carries counts.
	err := s.readFeed(ctx, r, "", func(ctx context.Context, db feed.DB, _ bool) (err error) {
		page, err = push.Deliveries(ctx, db, q)
		return err
	})
	if err != nil {
		s.dbError(w, r, "read deliveries", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, page)
}

// vapidPublicKey answers the key browsers subscribe with
// (PushManager.subscribe's applicationServerKey).
func (s *Server) vapidPublicKey(w http.ResponseWriter, r *http.Request, _ httprouter.Params, _ auth.User) {
	if s.cfg.VAPIDPublicKey == "" {
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "Web Push is not set up on this deployment (--vapid-key-file)"))
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=300")
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Key string `json:"key"`
	}{s.cfg.VAPIDPublicKey})
}
