package standin

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestDescribeMapsStatusesToThawKinds(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.InvalidArgument, "UserError: runtime.bundle 'x' must be an absolute path"),
			"UserError: runtime.bundle 'x' must be an absolute path"},
		{status.Error(codes.FailedPrecondition, "TupleMismatch: gpu_product differs"), "TupleMismatch: gpu_product differs"},
		{status.Error(codes.Unavailable, "connection refused"), "StoreError: connection refused"},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), "Timeout: context deadline exceeded"},
		{status.Error(codes.Internal, "internal error: KeyError: 'x'"), "ThawError: internal error: KeyError: 'x'"},
		{status.Error(codes.Unimplemented, "unknown method"), "ThawError(Unimplemented): unknown method"},
		{errors.New("thawd socket /run/thaw/thawd.sock: no such file"), "thawd socket /run/thaw/thawd.sock: no such file"},
	} {
		if got := describe(c.err); got != c.want {
			t.Errorf("describe(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestDescribeWithinNamesTheSettingOfADeadline(t *testing.T) {
	err := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	want := "Timeout: thawd did not answer within 5s (thawd.prepare_timeout_s + 1 s)"
	if got := describeWithin(err, 5*time.Second, "thawd.prepare_timeout_s + 1 s"); got != want {
		t.Errorf("describeWithin = %q, want %q", got, want)
	}
	other := status.Error(codes.Unavailable, "connection refused")
	if got := describeWithin(other, time.Second, "x"); got != "StoreError: connection refused" {
		t.Errorf("describeWithin of a non-deadline error = %q", got)
	}
}
