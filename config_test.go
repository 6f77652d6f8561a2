package gyre_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
)

func TestWithDefaults(t *testing.T) {
	c := gyre.Config{}.WithDefaults()
	if !strings.HasPrefix(c.Name, "w-") {
		t.Errorf("a lone worker with no address is named %q, want a random w-… name", c.Name)
	}
	want := gyre.Config{
		Name:              c.Name,
		Transport:         gyre.TransportQUIC,
		Stripes:           gyre.StripesAuto,
		SharedMemory:      gyre.SharedMemoryAuto,
		MaxFrame:          gyre.DefaultMaxFrame,
		DataAddr:          "127.0.0.1:7947",
		Advertise:         "127.0.0.1",
		Job:               gyre.DefaultJob,
		GossipTiming:      gyre.GossipLAN,
		WorldSize:         1,
		MinWorkers:        1,
		MaxWorkers:        gyre.MaxView,
		JoinTimeout:       gyre.DefaultJoinTimeout,
		ConnectTimeout:    gyre.DefaultConnectTimeout,
		GlobalBatch:       gyre.DefaultGlobalBatch,
		CollectiveTimeout: gyre.DefaultCollectiveTimeout,
		PeerTimeout:       gyre.DefaultPeerTimeout,
		StallThreshold:    gyre.DefaultStallThreshold,
		QuorumTimeout:     gyre.DefaultJoinTimeout,
		Shares:            []int{gyre.DefaultGlobalBatch},
		Balance:           gyre.BalanceLBBSP,
		RingOrder:         gyre.RingOrderAuto,
		Algo:              gyre.AlgoAuto,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if got := (gyre.Config{CollectiveTimeout: 30 * time.Second}).WithDefaults().StallThreshold; got != 15*time.Second {
		t.Errorf("stall threshold under a 30 s collective timeout: %v, want half of it", got)
	}
	if got := (gyre.Config{Listen: "127.0.0.1:0"}).WithDefaults().DataAddr; got != "127.0.0.1:0" {
		t.Fatalf("port 0 data address = %q, want it kept at 0", got)
	}
	if got := (gyre.Config{Listen: "[::1]:9000"}).WithDefaults().DataAddr; got != "[::1]:9001" {
		t.Fatalf("IPv6 data address = %q", got)
	}
	g := gyre.Config{Seeds: []string{"127.0.0.1:7000"}}.WithDefaults()
	if g.Listen != gyre.DefaultListen || g.WorldSize != 0 || g.Shares != nil || g.MinWorkers != 1 || !g.Gossip() {
		t.Fatalf("gossip defaults: listen %q world %d shares %v min %d", g.Listen, g.WorldSize, g.Shares, g.MinWorkers)
	}
	if (gyre.Config{}).WithDefaults().Gossip() {
		t.Fatal("a worker with neither Listen nor Seeds must not gossip")
	}
	if a := (gyre.Config{DataAddr: "127.0.0.1:9100", Advertise: "10.1.2.3"}).WithDefaults(); a.Name != "10.1.2.3:9100" || a.AdvertisedData() != "10.1.2.3:9100" {
		t.Fatalf("advertised host: name %q, data %q", a.Name, a.AdvertisedData())
	}
	launched := gyre.Config{Launcher: gyre.LauncherLaunch}
	if got := launched.WithDefaults().QuorumTimeout; got != gyre.LaunchQuorumWaits*gyre.DefaultPeerTimeout {
		t.Errorf("quorum timeout under launch: %v, want %d peer timeouts", got, gyre.LaunchQuorumWaits)
	}
	launched.PeerTimeout = 300 * time.Millisecond
	if got := launched.WithDefaults().QuorumTimeout; got != 1500*time.Millisecond {
		t.Errorf("quorum timeout under launch with a 300 ms peer timeout: %v, want 1.5 s", got)
	}
	launched.QuorumTimeout = time.Minute
	if got := launched.WithDefaults().QuorumTimeout; got != time.Minute {
		t.Errorf("a quorum timeout set under launch became %v", got)
	}
	v := gyre.Config{Peers: []string{"127.0.0.1:9001", "127.0.0.1:9002"}, Rank: 1}.WithDefaults()
	if v.DataAddr != "127.0.0.1:9002" || v.Name != "127.0.0.1:9002" || v.WorldSize != 2 {
		t.Fatalf("static view defaults: data %q name %q world %d", v.DataAddr, v.Name, v.WorldSize)
	}
}

func TestValidate(t *testing.T) {
	key := gyretest.Key(t)
	peers3 := []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"}
	tests := []struct {
		name    string
		cfg     gyre.Config
		wantErr string // substring; "" means valid
	}{
		{"defaults with key", gyre.Config{Key: key}, ""},
		{"tcp insecure needs no key", gyre.Config{Transport: "tcp", Insecure: true}, ""},
		{"a job of one needs no secret", gyre.Config{}, ""},
		{"no secret", gyre.Config{Peers: peers3}, "cluster secret is required"},
		{"quic insecure", gyre.Config{Key: key, Insecure: true}, "only available with the tcp"},
		{"unknown transport", gyre.Config{Key: key, Transport: "udp"}, `Transport "udp"`},
		{"too many stripes", gyre.Config{Key: key, Stripes: gyre.MaxStripes + 1}, "Stripes"},
		{"negative stripes", gyre.Config{Key: key, Stripes: -1}, "Stripes"},
		{"unknown shared-memory mode", gyre.Config{Key: key, SharedMemory: "on"}, "SharedMemory"},
		{"tiny frame", gyre.Config{Key: key, MaxFrame: 100}, "MaxFrame"},
		{"both key and file", gyre.Config{Key: key, KeyFile: "k"}, "not both"},
		{"bad key", gyre.Config{Key: "abc"}, "Key:"},
		{"bad listen", gyre.Config{Key: key, Listen: "localhost"}, "Listen"},
		{"empty host", gyre.Config{Key: key, Listen: ":7946"}, "missing host"},
		{"bad port", gyre.Config{Key: key, DataAddr: "127.0.0.1:99999"}, "DataAddr"},
		{"long name", gyre.Config{Key: key, Name: strings.Repeat("n", 256)}, "Name"},
		{"static view", gyre.Config{Key: key, Peers: peers3, Rank: 2, WorldSize: 3}, ""},
		{"rank without peers", gyre.Config{Key: key, Rank: 1}, "needs Peers"},
		{"world without peers", gyre.Config{Key: key, WorldSize: 4}, "needs Peers"},
		{"rank past end", gyre.Config{Key: key, Peers: peers3, Rank: 3, DataAddr: "127.0.0.1:9"}, "outside Peers"},
		{"negative rank", gyre.Config{Key: key, Peers: peers3, Rank: -1, DataAddr: "127.0.0.1:9"}, "outside Peers"},
		{"sizes disagree", gyre.Config{Key: key, Peers: peers3, WorldSize: 4}, "WorldSize 4"},
		{"duplicate peer", gyre.Config{Key: key, Peers: []string{"127.0.0.1:1", "127.0.0.1:1"}}, "are both"},
		{"peer port 0", gyre.Config{Key: key, Peers: []string{"127.0.0.1:1", "127.0.0.1:0"}}, "real port"},
		{"not in view", gyre.Config{Key: key, Peers: peers3, DataAddr: "127.0.0.1:5"}, "advertises"},
		{"negative local rank", gyre.Config{Key: key, LocalRank: -1}, "LocalRank"},
		{"unknown launcher", gyre.Config{Key: key, Launcher: "torchrun"}, `Launcher "torchrun"`},
		{"seeds", gyre.Config{Key: key, Seeds: []string{"127.0.0.1:7946"}}, ""},
		{"listen starts a job", gyre.Config{Key: key, Listen: "127.0.0.1:7000", MinWorkers: 4}, ""},
		{"seeds with peers", gyre.Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, Peers: peers3}, "Peers cannot be given with Seeds"},
		{"seeds with rank", gyre.Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, Rank: 2}, "Rank cannot"},
		{"seeds with world", gyre.Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, WorldSize: 2}, "WorldSize cannot"},
		{"seeds with shares", gyre.Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, Shares: []int{4}}, "Shares cannot"},
		{"bad seed", gyre.Config{Key: key, Seeds: []string{"nohost"}}, "Seeds[0]"},
		{"gossip needs secret", gyre.Config{Transport: "tcp", Insecure: true, Seeds: []string{"127.0.0.1:7946"}}, "gossip needs the cluster secret"},
		{"min past max", gyre.Config{Key: key, Listen: "127.0.0.1:7000", MinWorkers: 5, MaxWorkers: 4}, "MinWorkers 5"},
		{"max past view", gyre.Config{Key: key, Listen: "127.0.0.1:7000", MaxWorkers: gyre.MaxView + 1}, "MaxWorkers"},
		{"gossip timing", gyre.Config{Key: key, Listen: "127.0.0.1:7000", GossipTiming: "wan"}, "GossipTiming"},
		{"balance", gyre.Config{Key: key, Balance: "fastest"}, `Balance "fastest"`},
		{"ring order", gyre.Config{Key: key, RingOrder: "random"}, `RingOrder "random"`},
		{"algo", gyre.Config{Key: key, Algo: "tree"}, `Algo "tree"`},
		{"advertise with port", gyre.Config{Key: key, Advertise: "10.0.0.1:9100"}, "host only"},
		{"min workers past world", gyre.Config{Key: key, MinWorkers: 2}, "MinWorkers 2"},
		{"zero batch by shares", gyre.Config{Key: key, Shares: []int{0}}, "GlobalBatch 0"},
		{"fixed shares", gyre.Config{Key: key, Peers: peers3, Rank: 2, Shares: []int{5, 0, 3}}, ""},
		{"shares sum", gyre.Config{Key: key, Peers: peers3, Rank: 2, Shares: []int{5, 0, 3}, GlobalBatch: 9}, "sum to 8"},
		{"negative share", gyre.Config{Key: key, Peers: peers3, Rank: 2, Shares: []int{5, -1, 3}, GlobalBatch: 7}, "Shares[1] = -1"},
		{"shares count", gyre.Config{Key: key, Peers: peers3, Rank: 2, Shares: []int{5, 3}}, "Shares lists 2"},
		{"negative dataset", gyre.Config{Key: key, DatasetSize: -5}, "DatasetSize"},
		{"negative bucket", gyre.Config{Key: key, BucketBytes: -1}, "BucketBytes"},
		{"bad compression", gyre.Config{Key: key, Compress: "int8"}, `Compress "int8"`},
		{"compression", gyre.Config{Key: key, Compress: "bf16"}, ""},
		{"negative collective timeout", gyre.Config{Key: key, CollectiveTimeout: -time.Second}, "CollectiveTimeout"},
		{"peer timeout too short", gyre.Config{Key: key, PeerTimeout: time.Millisecond}, "PeerTimeout 1ms"},
		{"negative connect timeout", gyre.Config{Key: key, ConnectTimeout: -time.Second}, "ConnectTimeout"},
		// A gossiping worker's settings are checked as a static one's are.
		{"gossip bad compression", gyre.Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, Compress: "int8"}, `Compress "int8"`},
		{"gossip peer timeout", gyre.Config{Key: key, Listen: "127.0.0.1:7000", PeerTimeout: time.Millisecond}, "PeerTimeout 1ms"},
		{"gossip negative bucket", gyre.Config{Key: key, Listen: "127.0.0.1:7000", BucketBytes: -1}, "BucketBytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, gyre.ErrConfig) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want ErrConfig mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestValidateReportsEveryFault(t *testing.T) {
	err := gyre.Config{Transport: "x", Stripes: 99, Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}}.Validate()
	for _, want := range []string{"Transport", "Stripes", "secret"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate = %v, want it to mention %s", err, want)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		gyre.EnvTransport: "tcp", gyre.EnvInsecure: "true", gyre.EnvStripes: " 4 ",
		gyre.EnvKeyFile: "/k", gyre.EnvListen: "127.0.0.1:9000", gyre.EnvDataAddr: "127.0.0.1:9100",
		gyre.EnvAdvertise: "10.0.0.1", gyre.EnvName: "w3", gyre.EnvJob: "j", gyre.EnvMaxWorkers: "9",
		gyre.EnvGossipTiming: "local", gyre.EnvGossipProbeInterval: "3s", gyre.EnvGossipSuspicionMult: "6",
		gyre.EnvPeers: "127.0.0.1:9100, 127.0.0.1:9200", gyre.EnvRank: "1", gyre.EnvWorldSize: "2", gyre.EnvLocalRank: "1",
		gyre.EnvSeed: "10.0.0.1:7946,,10.0.0.2:7946", gyre.EnvMinWorkers: "2",
		gyre.EnvCollectiveTimeout: "90s", gyre.EnvPeerTimeout: " 500ms", gyre.EnvJoinTimeout: "1m", gyre.EnvBalance: "static",
		gyre.EnvConnectTimeout: "45s",
		gyre.EnvRingOrder:      "fixed", gyre.EnvAlgo: "doubling", gyre.EnvSharedMemory: "off",
		gyre.EnvCheckpointDir: "/ckpt", gyre.EnvCheckpointEvery: "20", gyre.EnvCheckpointKeep: "5", gyre.EnvCheckpointRequired: "true",
	}
	c, err := gyre.ConfigFromEnv(mapLookup(env))
	if err != nil {
		t.Fatal(err)
	}
	want := gyre.Config{Name: "w3", Transport: "tcp", Insecure: true, Stripes: 4, KeyFile: "/k",
		Listen: "127.0.0.1:9000", DataAddr: "127.0.0.1:9100", Advertise: "10.0.0.1", Job: "j", MaxWorkers: 9,
		GossipTiming: "local", GossipProbeInterval: 3 * time.Second, GossipSuspicionMult: 6,
		Peers: []string{"127.0.0.1:9100", "127.0.0.1:9200"}, Rank: 1, WorldSize: 2, LocalRank: 1,
		Seeds: []string{"10.0.0.1:7946", "10.0.0.2:7946"}, MinWorkers: 2,
		CollectiveTimeout: 90 * time.Second, PeerTimeout: 500 * time.Millisecond, JoinTimeout: time.Minute,
		ConnectTimeout: 45 * time.Second, Balance: gyre.BalanceStatic, RingOrder: gyre.RingOrderFixed, Algo: gyre.AlgoDoubling,
		SharedMemory:  gyre.SharedMemoryOff,
		CheckpointDir: "/ckpt", CheckpointEvery: 20, CheckpointKeep: 5, CheckpointRequired: true}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("ConfigFromEnv:\n got %+v\nwant %+v", c, want)
	}
	if c, err := gyre.ConfigFromEnv(mapLookup(nil)); err != nil || !reflect.DeepEqual(c, gyre.Config{}) {
		t.Fatalf("empty environment gave %+v, %v", c, err)
	}
}

func TestConfigFromEnvRejectsMalformed(t *testing.T) {
	_, err := gyre.ConfigFromEnv(mapLookup(map[string]string{gyre.EnvInsecure: "maybe", gyre.EnvStripes: "two", gyre.EnvRank: "first",
		gyre.EnvPeerTimeout: "soon", gyre.EnvCheckpointEvery: "often", gyre.EnvCheckpointRequired: "yes please"}))
	if !errors.Is(err, gyre.ErrConfig) {
		t.Fatalf("err = %v, want ErrConfig", err)
	}
	for _, name := range []string{gyre.EnvInsecure, gyre.EnvStripes, gyre.EnvRank, gyre.EnvPeerTimeout, gyre.EnvCheckpointEvery, gyre.EnvCheckpointRequired} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
}

func TestConfigSecret(t *testing.T) {
	key := gyretest.Key(t)
	s, err := gyre.Config{Key: key}.Secret()
	if err != nil || s.Hex() != key {
		t.Fatalf("Secret from Key = %v, %v", s, err)
	}
	if _, err := (gyre.Config{KeyFile: "/nonexistent/key"}).Secret(); err == nil {
		t.Fatal("missing key file gave no error")
	}
	if s, err := (gyre.Config{}).Secret(); err != nil || !s.IsZero() {
		t.Fatalf("no secret configured: %v, %v", s, err)
	}
}

func mapLookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestBalanceDefault: balancing is on unless Shares fix the shares, and an
// explicit Balance wins over that.
func TestBalanceDefault(t *testing.T) {
	peers := []string{"127.0.0.1:1", "127.0.0.1:2"}
	for _, tt := range []struct {
		c    gyre.Config
		want string
	}{
		{gyre.Config{}, gyre.BalanceLBBSP},
		{gyre.Config{Peers: peers, Shares: []int{3, 5}}, gyre.BalanceStatic},
		{gyre.Config{Peers: peers, Shares: []int{3, 5}, Balance: gyre.BalanceLBBSP}, gyre.BalanceLBBSP},
		{gyre.Config{Balance: gyre.BalanceStatic}, gyre.BalanceStatic},
	} {
		if got := tt.c.WithDefaults().Balance; got != tt.want {
			t.Errorf("%+v: Balance %q, want %q", tt.c, got, tt.want)
		}
	}
}

// TestValidateReportsOnlyTheRootCause: a field derived from a bad one is
// not reported as well, so the user reads about the flag they set.
func TestValidateReportsOnlyTheRootCause(t *testing.T) {
	key := gyretest.Key(t)
	for _, tt := range []struct {
		name string
		cfg  gyre.Config
		want string   // the one error
		not  []string // fields derived from it
	}{
		{"negative batch", gyre.Config{Key: key, GlobalBatch: -5}, "GlobalBatch -5", []string{"Shares"}},
		{"negative batch, static view", gyre.Config{Key: key, GlobalBatch: -5, Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}},
			"GlobalBatch -5", []string{"Shares"}},
		{"bad listen", gyre.Config{Key: key, Listen: "nonsense"}, `Listen "nonsense"`, []string{"Advertise", "DataAddr"}},
		{"bad peer", gyre.Config{Key: key, Peers: []string{"nonsense", "127.0.0.1:2"}}, `Peers[0] "nonsense"`, []string{"Advertise", "DataAddr"}},
		// A derived address that is bad although its source is fine is
		// still reported, naming the derived field.
		{"listen at the last port", gyre.Config{Key: key, Listen: "127.0.0.1:65535"}, `DataAddr "127.0.0.1:65536"`, []string{"Advertise"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error mentioning %s", err, tt.want)
			}
			if j, ok := err.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) != 1 {
				t.Errorf("Validate reported %d errors, want only the root cause:\n%v", len(j.Unwrap()), err)
			}
			for _, n := range tt.not {
				if strings.Contains(err.Error(), n) {
					t.Errorf("Validate = %v; it should not mention %s, which follows from the root cause", err, n)
				}
			}
		})
	}
}

// TestConfigFromEnvLogs: GYRE_LOG_LEVEL and GYRE_LOG_FORMAT, which gyre
// launch sets, choose an embedded trainer's logs as they do gyre's own.
func TestConfigFromEnvLogs(t *testing.T) {
	env := func(kv map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
	}
	c, err := gyre.ConfigFromEnv(env(nil))
	if err != nil || c.Logger != nil {
		t.Fatalf("no log variables: Logger %v, err %v; want nil, the default", c.Logger, err)
	}
	c, err = gyre.ConfigFromEnv(env(map[string]string{gyre.EnvLogLevel: "info", gyre.EnvLogFormat: "json"}))
	if err != nil || c.Logger == nil || c.Logger.GetLevel() != zerolog.InfoLevel {
		t.Fatalf("GYRE_LOG_LEVEL=info: Logger %v, err %v; want one at info", c.Logger, err)
	}
	c, err = gyre.ConfigFromEnv(env(map[string]string{gyre.EnvLogFormat: "console"}))
	if err != nil || c.Logger == nil || c.Logger.GetLevel() != zerolog.WarnLevel {
		t.Fatalf("GYRE_LOG_FORMAT alone: Logger %v, err %v; want one at warn", c.Logger, err)
	}
	if _, err = gyre.ConfigFromEnv(env(map[string]string{gyre.EnvLogLevel: "loud"})); !errors.Is(err, gyre.ErrConfig) || !strings.Contains(err.Error(), gyre.EnvLogLevel) {
		t.Fatalf("GYRE_LOG_LEVEL=loud: %v, want ErrConfig naming the variable", err)
	}
}
