package standin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func noDefaultFile(t *testing.T) {
	old := defaultConfigFile
	defaultConfigFile = filepath.Join(t.TempDir(), "absent.toml")
	t.Cleanup(func() { defaultConfigFile = old })
}

func writeFile(t *testing.T, text string) string {
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsWithoutFileOrEnv(t *testing.T) {
	noDefaultFile(t)
	c, err := LoadConfig(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/run/thaw/thawd.sock" || c.StateDir != "/run/thaw/standin" ||
		c.LogPath != "/var/log/thaw/standin.log" || c.File != "" {
		t.Fatalf("defaults: %+v", c)
	}
	if c.PrepareTimeout != 5*time.Second {
		t.Fatalf("deadline: %v", c.PrepareTimeout)
	}
}

func TestDefaultFileIsReadWhenPresent(t *testing.T) {
	old := defaultConfigFile
	defaultConfigFile = writeFile(t, "[thawd]\nsocket = \"/srv/thawd.sock\"\n")
	t.Cleanup(func() { defaultConfigFile = old })
	c, err := LoadConfig(env(nil))
	if err != nil || c.Socket != "/srv/thawd.sock" || c.File != defaultConfigFile {
		t.Fatalf("%+v %v", c, err)
	}
}

func TestEnvBeatsFileBeatsDefault(t *testing.T) {
	noDefaultFile(t)
	f := writeFile(t, "[thawd]\nsocket = \"/file/thawd.sock\"\nprepare_timeout_s = 2\n"+
		"[standin]\nlog = \"/file/standin.log\"\n[other]\nunknown = 1\n")
	c, err := LoadConfig(env(map[string]string{"THAW_CONFIG": f, "THAW_THAWD_SOCKET": "/env/thawd.sock",
		"THAW_THAWD_HEALTH_TIMEOUT_S": " 7.5 "}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/env/thawd.sock" || c.LogPath != "/file/standin.log" || c.StateDir != "/run/thaw/standin" {
		t.Fatalf("%+v", c)
	}
	if c.PrepareTimeout != 3*time.Second {
		t.Fatalf("deadline: %v", c.PrepareTimeout)
	}
}

func TestBadValuesNameTheKeyAndTheSource(t *testing.T) {
	noDefaultFile(t)
	f := writeFile(t, "[thawd]\nprepare_timeout_s = -3\n")
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"THAW_CONFIG": f}, "config thawd.prepare_timeout_s: expected 0.5 .. 60, got -3 (from file " + f + ")"},
		{map[string]string{"THAW_THAWD_SOCKET": "run/thawd.sock"}, "config thawd.socket: expected an absolute path"},
		{map[string]string{"THAW_STANDIN_LOG": ""}, "config standin.log: expected a path, got an empty string (from env THAW_STANDIN_LOG)"},
		{map[string]string{"THAW_THAWD_PREPARE_TIMEOUT_S": "nan"}, "config thawd.prepare_timeout_s: expected a finite number"},
		{map[string]string{"THAW_THAWD_PREPARE_TIMEOUT_S": "soon"}, "config thawd.prepare_timeout_s: expected a number"},
		{map[string]string{"THAW_CONFIG": f + ".absent"}, "config file does not exist"},
		{map[string]string{"THAW_CONFIG": writeFile(t, "[thawd\n")}, "not valid TOML"},
		{map[string]string{"THAW_CONFIG": writeFile(t, "thawd = 1\n")}, "config thawd: expected a [thawd] table"},
		{map[string]string{"THAW_CONFIG": writeFile(t, "[standin]\nstate_dir = true\n")}, "config standin.state_dir: expected a string"},
	} {
		c, err := LoadConfig(env(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.env, err, tc.want)
		}
		if c.Socket == "" || c.PrepareTimeout <= prepareSlack {
			t.Errorf("%v: a bad value must leave the defaults in place: %+v", tc.env, c)
		}
	}
}

func TestGeneratedDefaultsParse(t *testing.T) {
	for _, k := range configKeys {
		if _, err := k.parse(k.Default, "default"); err != nil {
			t.Error(err)
		}
	}
}

func TestSizesAndCountsAreReadAsThawReadsThem(t *testing.T) {
	noDefaultFile(t)
	f := writeFile(t, "[standin]\nlog_max_bytes = \"1.5m\"\nlog_keep = 5\n[node]\nlog_dir = \"/srv/log\"\n")
	c, err := LoadConfig(env(map[string]string{"THAW_CONFIG": f, "THAW_STANDIN_SHIM_LOGS_KEEP": " 1_000 ",
		"THAW_STANDIN_SHIM_LOG_MAX_BYTES": "64k"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.LogMaxBytes != 3<<19 || c.LogKeep != 5 || c.ShimLogsKeep != 1000 || c.ShimLogMax != 64<<10 ||
		c.ShimLogDir != "/srv/log/shim" {
		t.Fatalf("%+v", c)
	}
	for _, bad := range []map[string]string{{"THAW_STANDIN_LOG_KEEP": "0"}, {"THAW_STANDIN_LOG_KEEP": "2.5"},
		{"THAW_STANDIN_LOG_MAX_BYTES": "lots"}, {"THAW_STANDIN_LOG_MAX_BYTES": "1k"}} {
		if _, err := LoadConfig(env(bad)); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
}
