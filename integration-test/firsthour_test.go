package integration

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestStartupErrorsNameTheSettings: start-up errors a user causes name
// the settings to change: a config directory that does not exist (and the
// common mistake of a RUNTIME_ROOT that already ends in the app
// directory), and a port another process holds.
func TestStartupErrorsNameTheSettings(t *testing.T) {
	t.Run("config directory", func(t *testing.T) {
		env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
		env["RUNTIME_ROOT"] = filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
		env["RUNTIME_SUBDIRECTORY"] = ""
		code, out := runToExit(t, env)
		for _, want := range []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "FORCE_START_WITHOUT_INITIAL_CONFIG",
			`RUNTIME_ROOT already ends in "config"`} {
			if code == 0 || !strings.Contains(out, want) {
				t.Errorf("exit %d, output lacks %s:\n%s", code, want, out)
			}
		}
	})
	t.Run("port in use", func(t *testing.T) {
		held, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
		env["PORT"] = strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
		code, out := runToExit(t, env)
		if code == 0 || !strings.Contains(out, "set by HOST and PORT") || !strings.Contains(out, "address already in use") {
			t.Errorf("exit %d, want the error to name HOST and PORT:\n%s", code, out)
		}
	})
}
