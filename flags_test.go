package gyre_test

import (
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/gyre-ml/gyre"
)

func TestBindFlags(t *testing.T) {
	args := []string{"--transport", "tcp", "--insecure", "--stripes", "2", "--listen", "127.0.0.1:9000",
		"--seed", "10.0.0.1:7946", "--seed", "10.0.0.2:7946,10.0.0.3:7946", "--peers", "127.0.0.1:1,127.0.0.1:2",
		"--rank", "1", "--min-workers", "2", "--batch", "96", "--shares", "64,32", "--rng-seed", "7", "--bucket-bytes", "4096",
		"--collective-timeout", "90s", "--peer-timeout", "500ms", "--ring-order", "fixed"}
	want := gyre.Config{Transport: "tcp", Insecure: true, Stripes: 2, Listen: "127.0.0.1:9000",
		Seeds: []string{"10.0.0.1:7946", "10.0.0.2:7946", "10.0.0.3:7946"},
		Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}, Rank: 1, MinWorkers: 2, GlobalBatch: 96,
		Shares: []int{64, 32}, RNGSeed: 7, BucketBytes: 4096, KeyFile: "/env/key",
		CollectiveTimeout: 90 * time.Second, PeerTimeout: 500 * time.Millisecond, RingOrder: gyre.RingOrderFixed}
	for _, kind := range []string{"flag", "pflag"} {
		t.Run(kind, func(t *testing.T) {
			// Values from the environment are the defaults; flags override.
			c := gyre.Config{KeyFile: "/env/key", Peers: []string{"127.0.0.1:9"}}
			var err error
			if kind == "flag" {
				fs := flag.NewFlagSet("t", flag.ContinueOnError)
				c.BindFlags(fs)
				err = fs.Parse(args)
			} else {
				fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
				c.BindPFlags(fs)
				err = fs.Parse(args)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c, want) {
				t.Fatalf("bound config:\n got %+v\nwant %+v", c, want)
			}
		})
	}
}

func TestBindFlagsRejectsBadShares(t *testing.T) {
	var c gyre.Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	c.BindFlags(fs)
	if err := fs.Parse([]string{"--shares", "3,-1"}); err == nil || !strings.Contains(err.Error(), `"-1"`) {
		t.Fatalf("Parse = %v, want an error naming -1", err)
	}
}

// TestFlagUsageNamesValueTypes: no usage string holds a back-quoted word,
// which both flag packages would show as the value's name (--key-file
// once read "--key-file gyre keygen" in --help).
func TestFlagUsageNamesValueTypes(t *testing.T) {
	var c gyre.Config
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	c.BindPFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if strings.Contains(f.Usage, "`") {
			t.Errorf("--%s's usage %q holds a back-quote", f.Name, f.Usage)
		}
	})
	usage := fs.FlagUsages()
	if !strings.Contains(usage, "--key-file string") {
		t.Errorf("--help shows --key-file without its type:\n%s", usage)
	}
	gfs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.BindFlags(gfs)
	if name, _ := flag.UnquoteUsage(gfs.Lookup("key-file")); name != "string" {
		t.Errorf("flag.UnquoteUsage names --key-file's value %q, want string", name)
	}
}
