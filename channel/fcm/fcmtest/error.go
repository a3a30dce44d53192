package fcmtest

import (
	"encoding/json"
	"net/http"
)

// Error is an error answer of FCM's, written as Google writes them:
//
//	{"error":{"code":404,"message":"…","status":"NOT_FOUND","details":[
//	  {"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}
type Error struct {
	Code      int    // the HTTP status, also the body's code
	Status    string // google.rpc.Code's name: NOT_FOUND, INVALID_ARGUMENT, …
	ErrorCode string // the FcmError detail's errorCode; "" for no FcmError detail
	Message   string
	// Field, when set, adds a google.rpc.BadRequest detail whose field
	// violation names it (message.token, message.data[0].value, …).
	Field string
	// RetryAfter, when set, is the answer's Retry-After header.
	RetryAfter string
}

// The errors FCM answers, with the bodies it writes
// (https://firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode).
// Copy one to change it: e := fcmtest.Unavailable; e.RetryAfter = "30".
var (
	Unregistered = Error{Code: 404, Status: "NOT_FOUND", ErrorCode: "UNREGISTERED",
		Message: "Requested entity was not found."}
	// InvalidToken is how FCM refuses a token that is not one: an
	// FcmError, no field violation, the token named in the message.
	InvalidToken = Error{Code: 400, Status: "INVALID_ARGUMENT", ErrorCode: "INVALID_ARGUMENT",
		Message: "The registration token is not a valid FCM registration token"}
	// InvalidTokenField refuses the token through a field violation.
	InvalidTokenField = Error{Code: 400, Status: "INVALID_ARGUMENT",
		Message: "Invalid value at 'message.token' (TYPE_STRING), \"x\"", Field: "message.token"}
	// InvalidArgument refuses something else of the message (its TTL).
	InvalidArgument = Error{Code: 400, Status: "INVALID_ARGUMENT", ErrorCode: "INVALID_ARGUMENT",
		Message: "Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), \"x\"",
		Field:   "message.android.ttl"}
	SenderIDMismatch = Error{Code: 403, Status: "PERMISSION_DENIED", ErrorCode: "SENDER_ID_MISMATCH",
		Message: "SenderId mismatch"}
	QuotaExceeded = Error{Code: 429, Status: "RESOURCE_EXHAUSTED", ErrorCode: "QUOTA_EXCEEDED",
		Message: "Sending limit exceeded for the message target."}
	Unavailable = Error{Code: 503, Status: "UNAVAILABLE", ErrorCode: "UNAVAILABLE",
		Message: "The service is currently unavailable."}
	Internal = Error{Code: 500, Status: "INTERNAL", ErrorCode: "INTERNAL",
		Message: "Internal error encountered."}
	// ThirdPartyAuth: the app's APNs certificate or Web Push key in
	// Firebase was refused.
	ThirdPartyAuth = Error{Code: 401, Status: "UNAUTHENTICATED", ErrorCode: "THIRD_PARTY_AUTH_ERROR",
		Message: "Auth error from APNS or Web Push Service"}
	// Unauthenticated: the bearer token is not one, or has expired.
	Unauthenticated = Error{Code: 401, Status: "UNAUTHENTICATED",
		Message: "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."}
	// PermissionDenied: the service account may not send for the project.
	PermissionDenied = Error{Code: 403, Status: "PERMISSION_DENIED",
		Message: "Permission 'cloudmessaging.messages.create' denied on resource (or it may not exist)."}
)

const (
	fcmErrorType   = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
	badRequestType = "type.googleapis.com/google.rpc.BadRequest"
)

// write answers e.
func (e Error) write(w http.ResponseWriter) {
	var details []any
	if e.ErrorCode != "" {
		details = append(details, map[string]string{"@type": fcmErrorType, "errorCode": e.ErrorCode})
	}
	if e.Field != "" {
		details = append(details, map[string]any{"@type": badRequestType,
			"fieldViolations": []map[string]string{{"field": e.Field, "description": e.Message}}})
	}
	body := map[string]any{"code": e.Code, "message": e.Message, "status": e.Status}
	if details != nil {
		body["details"] = details
	}
	if e.RetryAfter != "" {
		w.Header().Set("Retry-After", e.RetryAfter)
	}
	writeJSON(w, e.Code, map[string]any{"error": body})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
