package standin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// DefaultConfigFile is the node's thaw configuration. Twin: control/config.py
// DEFAULT_CONFIG_FILE.
const DefaultConfigFile = "/etc/thaw/config.toml"

var defaultConfigFile = DefaultConfigFile // tests point it elsewhere

// prepareSlack is how much longer than thawd.prepare_timeout_s create waits
// for thawd's answer: thawd waits that long for a fetch and then still has
// to load the bundle and answer. Twin: the help of thawd.prepare_timeout_s in
// control/config.py, and tests/functional/test_standin_config.py.
const prepareSlack = time.Second

// printConfigCommand, as the only argument, makes thaw-runsc-hooks print the
// configuration it would use as JSON and exit (tests/functional/test_standin_config.py
// compares it with control/config.py's view of the same file and env). It
// is no runsc subcommand, so no shim ever sends it.
const printConfigCommand = "thaw-config"

// Config is what the stand-in takes from thaw's configuration. The keys,
// their defaults and ranges are configKeys (config_keys.go), generated from
// control/config.py's table; they are read by thaw's own rules (control/config.py
// load): THAW_<SECTION>_<KEY> > the file ($THAW_CONFIG, else /etc/thaw/config.toml
// when it exists) > default. The shim runs the stand-in with containerd's
// environment, so on a node the file is what thawd and the stand-in share.
type Config struct {
	RealRunsc      string        // THAW_REAL_RUNSC (test harnesses), else "runsc" beside this binary, as thaw-runsc
	Socket         string        // thawd.socket
	StateDir       string        // standin.state_dir: create -> start markers
	LogPath        string        // standin.log: one JSON line per decision
	PrepareTimeout time.Duration // thawd.prepare_timeout_s + prepareSlack: create's deadline for thawd
	LogMaxBytes    int64         // standin.log_max_bytes: rotate standin.log at this size
	LogKeep        int           // standin.log_keep: rotated logs kept
	ShimLogDir     string        // <node.log_dir>/shim: the shim's runsc-shim-<id>.log (containerd_config.py)
	ShimLogsKeep   int           // standin.shim_logs_keep: deleted containers' shim logs kept
	ShimLogMax     int64         // standin.shim_log_max_bytes: a deleted container's shim log is cut to this

	File   string         // the config file read; "" when none
	Values map[string]any // every key's effective value (string or float64 seconds)
}

type configKind int

const (
	kindAbsPath configKind = iota // control/config.py ABS_PATH
	kindSeconds                   // control/config.py SECONDS (with a range)
	kindSize                      // control/config.py SIZE (with a range)
	kindInt                       // control/config.py INT (with a range)
)

// configKey is one row of control/config.py KEYS that the stand-in reads.
type configKey struct {
	Name     string // "section.name"
	Env      string // THAW_<SECTION>_<NAME>
	Kind     configKind
	Default  string // parsed like a value from the file
	Min, Max float64
}

// LoadConfig reads the stand-in's keys. On an error (a bad value, an
// unreadable file) the keys it could not read keep their defaults and the
// error names the key and where the value came from, as thaw's ConfigError
// does; the caller then starts containers cold.
func LoadConfig(lookupEnv func(string) (string, bool)) (Config, error) {
	vals := map[string]any{}
	for _, k := range configKeys {
		v, err := k.parse(k.Default, "default")
		if err != nil {
			panic(err) // a generated default that its own parser refuses: a build bug
		}
		vals[k.Name] = v
	}
	c := Config{Values: vals}
	var errs []error

	path, explicit := lookupEnv("THAW_CONFIG")
	if !explicit || path == "" {
		path, explicit = defaultConfigFile, false
	}
	if doc, err := readTOML(path, explicit); err != nil {
		errs = append(errs, err)
	} else if doc != nil {
		c.File = path
		for _, k := range configKeys {
			sec, name, _ := strings.Cut(k.Name, ".")
			table, ok := doc[sec]
			if !ok {
				continue
			}
			t, ok := table.(map[string]any)
			if !ok {
				errs = append(errs, fmt.Errorf("config %s: expected a [%s] table in %s", sec, sec, path))
				continue
			}
			if raw, ok := t[name]; ok {
				if v, err := k.parse(raw, "file "+path); err != nil {
					errs = append(errs, err)
				} else {
					vals[k.Name] = v
				}
			}
		}
	}
	for _, k := range configKeys {
		if raw, ok := lookupEnv(k.Env); ok {
			if v, err := k.parse(raw, "env "+k.Env); err != nil {
				errs = append(errs, err)
			} else {
				vals[k.Name] = v
			}
		}
	}

	c.Socket = vals["thawd.socket"].(string)
	c.StateDir = vals["standin.state_dir"].(string)
	c.LogPath = vals["standin.log"].(string)
	c.PrepareTimeout = seconds(vals["thawd.prepare_timeout_s"].(float64)) + prepareSlack
	c.LogMaxBytes = int64(vals["standin.log_max_bytes"].(float64))
	c.LogKeep = int(vals["standin.log_keep"].(float64))
	c.ShimLogDir = filepath.Join(vals["node.log_dir"].(string), "shim") // twin: control/node/containerd_config.py runsc_toml
	c.ShimLogsKeep = int(vals["standin.shim_logs_keep"].(float64))
	c.ShimLogMax = int64(vals["standin.shim_log_max_bytes"].(float64))
	if v, ok := lookupEnv("THAW_REAL_RUNSC"); ok && v != "" {
		c.RealRunsc = v
	} else if exe, err := os.Executable(); err == nil {
		c.RealRunsc = filepath.Join(filepath.Dir(exe), "runsc") // twin: go/cmd/thaw-runsc
	}
	return c, errors.Join(errs...)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// readTOML returns nil, nil for an absent default file (as control/config.py).
func readTOML(path string, explicit bool) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return nil, nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("config %s: config file does not exist", path)
	}
	if err != nil {
		return nil, fmt.Errorf("config %s: %v", path, err)
	}
	var doc map[string]any
	if err := toml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("config %s: not valid TOML: %v", path, err)
	}
	return doc, nil
}

func (k configKey) parse(raw any, source string) (any, error) {
	v, err := k.value(raw)
	if err != nil {
		return nil, fmt.Errorf("config %s: %v (from %s)", k.Name, err, source)
	}
	return v, nil
}

// value mirrors the parsers of control/config.py (_abs_path, _float + the range).
func (k configKey) value(raw any) (any, error) {
	switch k.Kind {
	case kindAbsPath:
		s, ok := raw.(string)
		if !ok {
			return nil, fmt.Errorf("expected a string, got %v", raw)
		}
		if s == "" {
			return nil, errors.New("expected a path, got an empty string")
		}
		if !filepath.IsAbs(s) {
			return nil, fmt.Errorf("expected an absolute path, got %q", s)
		}
		return s, nil
	case kindSeconds:
		var f float64
		switch x := raw.(type) {
		case int64:
			f = float64(x)
		case float64:
			f = x
		case string:
			var err error
			if f, err = strconv.ParseFloat(strings.TrimSpace(x), 64); err != nil {
				return nil, fmt.Errorf("expected a number, got %q", x)
			}
		default:
			return nil, fmt.Errorf("expected a number, got %v", raw)
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("expected a finite number, got %v", raw)
		}
		if f < k.Min || f > k.Max {
			return nil, fmt.Errorf("expected %g .. %g, got %v", k.Min, k.Max, raw)
		}
		return f, nil
	case kindSize, kindInt:
		n, err := k.integer(raw)
		if err != nil {
			return nil, err
		}
		if float64(n) < k.Min || float64(n) > k.Max {
			lo, hi := showNumber(k, k.Min), showNumber(k, k.Max)
			return nil, fmt.Errorf("expected %s .. %s, got %v", lo, hi, quoted(raw))
		}
		return float64(n), nil
	}
	return nil, fmt.Errorf("unknown kind %d", k.Kind)
}

// sizeUnits are control/config.py _SIZE_UNITS.
var sizeUnits = map[byte]int64{'k': 1 << 10, 'm': 1 << 20, 'g': 1 << 30, 't': 1 << 40}

// integer mirrors control/config.py _int and _size: an integer, or a string of
// one (underscores allowed; a size may end in k, m, g or t and have a fraction).
func (k configKey) integer(raw any) (int64, error) {
	what := "an integer"
	if k.Kind == kindSize {
		what = "a size in bytes"
	}
	switch x := raw.(type) {
	case int64:
		return x, nil
	case string:
		s := strings.ReplaceAll(strings.TrimSpace(x), "_", "")
		if k.Kind == kindSize && s != "" {
			if unit, ok := sizeUnits[strings.ToLower(s[len(s)-1:])[0]]; ok {
				f, err := strconv.ParseFloat(s[:len(s)-1], 64)
				if err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
					return int64(f * float64(unit)), nil
				}
				return 0, fmt.Errorf("expected %s (suffixes k, m, g, t allowed), got %q", what, x)
			}
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			if k.Kind == kindSize {
				return 0, fmt.Errorf("expected %s (suffixes k, m, g, t allowed), got %q", what, x)
			}
			return 0, fmt.Errorf("expected %s, got %q", what, x)
		}
		return n, nil
	}
	return 0, fmt.Errorf("expected %s, got %v", what, raw)
}

// showNumber is control/config.py _show_number for sizes: the largest unit that divides.
func showNumber(k configKey, x float64) string {
	if k.Kind == kindSize && x != 0 {
		for _, u := range []byte{'t', 'g', 'm', 'k'} {
			if int64(x)%sizeUnits[u] == 0 {
				return fmt.Sprintf("%d%c", int64(x)/sizeUnits[u], u)
			}
		}
	}
	return fmt.Sprintf("%g", x)
}

func quoted(raw any) string {
	if s, ok := raw.(string); ok {
		return "'" + s + "'" // Python's repr of a str, as ConfigError shows it
	}
	return fmt.Sprint(raw)
}

// printConfig writes the effective configuration as one JSON object; on a
// configuration error, the error too, and exits 78 (EX_CONFIG, as thaw).
func printConfig(c Config, err error) int {
	out := map[string]any{"file": c.File, "keys": c.Values, "real_runsc": c.RealRunsc,
		"prepare_deadline_s": c.PrepareTimeout.Seconds()}
	if err != nil {
		out["error"] = err.Error()
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	if err != nil {
		return 78
	}
	return 0
}
