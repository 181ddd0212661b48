package standin

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// describeWithin is describe, and when the call ran out of time, which
// deadline it was and the setting that bounds it ("every timeout names its
// setting": a reason a user reads in the decision log, issue 31).
func describeWithin(err error, deadline time.Duration, setting string) string {
	if status.Code(err) == codes.DeadlineExceeded {
		return fmt.Sprintf("Timeout: thawd did not answer within %v (%s)", deadline.Round(time.Millisecond), setting)
	}
	return describe(err)
}

// describe turns a gRPC error from thawd into thaw's error kind and message.
// thawd writes "<ThawError class>: <message>" as a status's details
// (control/thawd/server.py `_rpc`); for details without a class the kind
// comes from the status code, the reverse of control/errors.py GRPC_STATUS
// (twin: control/thawd/client.py error_from_status). Errors that are not
// statuses (a dead socket) keep their own text.
func describe(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	return errorKind(st.Code().String(), st.Message()) + ": " + message(st.Message())
}

// kindByCode is control/errors.py GRPC_STATUS read backwards: the first class
// listed for each status. Twin: that table.
var kindByCode = map[string]string{
	"FailedPrecondition": "ConfigError",
	"ResourceExhausted":  "CacheFull",
	"Unavailable":        "StoreError",
	"DataLoss":           "IntegrityError",
	"NotFound":           "NotFound",
	"AlreadyExists":      "AlreadyExists",
	"InvalidArgument":    "UserError",
	"DeadlineExceeded":   "Timeout",
	"Internal":           "ThawError",
}

func errorKind(code, details string) string {
	if name, _, ok := strings.Cut(details, ": "); ok && isClassName(name) {
		return name
	}
	if k, ok := kindByCode[code]; ok {
		return k
	}
	return "ThawError(" + code + ")"
}

func message(details string) string {
	if name, rest, ok := strings.Cut(details, ": "); ok && isClassName(name) {
		return rest
	}
	return details
}

// isClassName: thaw's exception classes are CamelCase words ending in Error,
// or one of the few that do not (NotFound, Timeout, ...).
func isClassName(s string) bool {
	if s == "" || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for _, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
