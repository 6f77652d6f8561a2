package gyre

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/secret"
)

func testKey(tb testing.TB) string {
	tb.Helper()
	s, err := secret.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	return s.Hex()
}

func TestWithDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if !strings.HasPrefix(c.Name, "w-") {
		t.Errorf("a lone worker with no address is named %q, want a random w-… name", c.Name)
	}
	want := Config{
		Name:              c.Name,
		Transport:         TransportQUIC,
		Stripes:           1,
		MaxFrame:          DefaultMaxFrame,
		DataAddr:          "127.0.0.1:7947",
		Advertise:         "127.0.0.1",
		Job:               DefaultJob,
		GossipTiming:      GossipLAN,
		WorldSize:         1,
		MinWorkers:        1,
		MaxWorkers:        MaxView,
		JoinTimeout:       DefaultJoinTimeout,
		ConnectTimeout:    DefaultConnectTimeout,
		GlobalBatch:       DefaultGlobalBatch,
		CollectiveTimeout: DefaultCollectiveTimeout,
		PeerTimeout:       DefaultPeerTimeout,
		StallThreshold:    DefaultStallThreshold,
		QuorumTimeout:     DefaultJoinTimeout,
		Shares:            []int{DefaultGlobalBatch},
		Balance:           BalanceLBBSP,
		RingOrder:         RingOrderAuto,
		Algo:              AlgoAuto,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if got := (Config{CollectiveTimeout: 30 * time.Second}).WithDefaults().StallThreshold; got != 15*time.Second {
		t.Errorf("stall threshold under a 30 s collective timeout: %v, want half of it", got)
	}
	if got := (Config{Listen: "127.0.0.1:0"}).WithDefaults().DataAddr; got != "127.0.0.1:0" {
		t.Fatalf("port 0 data address = %q, want it kept at 0", got)
	}
	if got := (Config{Listen: "[::1]:9000"}).WithDefaults().DataAddr; got != "[::1]:9001" {
		t.Fatalf("IPv6 data address = %q", got)
	}
	g := Config{Seeds: []string{"127.0.0.1:7000"}}.WithDefaults()
	if g.Listen != DefaultListen || g.WorldSize != 0 || g.Shares != nil || g.MinWorkers != 1 || !g.Gossip() {
		t.Fatalf("gossip defaults: listen %q world %d shares %v min %d", g.Listen, g.WorldSize, g.Shares, g.MinWorkers)
	}
	if (Config{}).WithDefaults().Gossip() {
		t.Fatal("a worker with neither Listen nor Seeds must not gossip")
	}
	if a := (Config{DataAddr: "127.0.0.1:9100", Advertise: "10.1.2.3"}).WithDefaults(); a.Name != "10.1.2.3:9100" || a.AdvertisedData() != "10.1.2.3:9100" {
		t.Fatalf("advertised host: name %q, data %q", a.Name, a.AdvertisedData())
	}
	v := Config{Peers: []string{"127.0.0.1:9001", "127.0.0.1:9002"}, Rank: 1}.WithDefaults()
	if v.DataAddr != "127.0.0.1:9002" || v.Name != "127.0.0.1:9002" || v.WorldSize != 2 {
		t.Fatalf("static view defaults: data %q name %q world %d", v.DataAddr, v.Name, v.WorldSize)
	}
}

func TestValidate(t *testing.T) {
	key := testKey(t)
	peers3 := []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"}
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // substring; "" means valid
	}{
		{"defaults with key", Config{Key: key}, ""},
		{"tcp insecure needs no key", Config{Transport: "tcp", Insecure: true}, ""},
		{"a job of one needs no secret", Config{}, ""},
		{"no secret", Config{Peers: peers3}, "cluster secret is required"},
		{"quic insecure", Config{Key: key, Insecure: true}, "only available with the tcp"},
		{"unknown transport", Config{Key: key, Transport: "udp"}, `Transport "udp"`},
		{"too many stripes", Config{Key: key, Stripes: MaxStripes + 1}, "Stripes"},
		{"negative stripes", Config{Key: key, Stripes: -1}, "Stripes"},
		{"tiny frame", Config{Key: key, MaxFrame: 100}, "MaxFrame"},
		{"both key and file", Config{Key: key, KeyFile: "k"}, "not both"},
		{"bad key", Config{Key: "abc"}, "Key:"},
		{"bad listen", Config{Key: key, Listen: "localhost"}, "Listen"},
		{"empty host", Config{Key: key, Listen: ":7946"}, "missing host"},
		{"bad port", Config{Key: key, DataAddr: "127.0.0.1:99999"}, "DataAddr"},
		{"long name", Config{Key: key, Name: strings.Repeat("n", 256)}, "Name"},
		{"static view", Config{Key: key, Peers: peers3, Rank: 2, WorldSize: 3}, ""},
		{"rank without peers", Config{Key: key, Rank: 1}, "needs Peers"},
		{"world without peers", Config{Key: key, WorldSize: 4}, "needs Peers"},
		{"rank past end", Config{Key: key, Peers: peers3, Rank: 3, DataAddr: "127.0.0.1:9"}, "outside Peers"},
		{"negative rank", Config{Key: key, Peers: peers3, Rank: -1, DataAddr: "127.0.0.1:9"}, "outside Peers"},
		{"sizes disagree", Config{Key: key, Peers: peers3, WorldSize: 4}, "WorldSize 4"},
		{"duplicate peer", Config{Key: key, Peers: []string{"127.0.0.1:1", "127.0.0.1:1"}}, "are both"},
		{"peer port 0", Config{Key: key, Peers: []string{"127.0.0.1:1", "127.0.0.1:0"}}, "real port"},
		{"not in view", Config{Key: key, Peers: peers3, DataAddr: "127.0.0.1:5"}, "advertises"},
		{"negative local rank", Config{Key: key, LocalRank: -1}, "LocalRank"},
		{"seeds", Config{Key: key, Seeds: []string{"127.0.0.1:7946"}}, ""},
		{"listen starts a job", Config{Key: key, Listen: "127.0.0.1:7000", MinWorkers: 4}, ""},
		{"seeds with peers", Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, Peers: peers3}, "Peers cannot be given with Seeds"},
		{"seeds with rank", Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, Rank: 2}, "Rank cannot"},
		{"seeds with world", Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, WorldSize: 2}, "WorldSize cannot"},
		{"seeds with shares", Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, Shares: []int{4}}, "Shares cannot"},
		{"bad seed", Config{Key: key, Seeds: []string{"nohost"}}, "Seeds[0]"},
		{"gossip needs secret", Config{Transport: "tcp", Insecure: true, Seeds: []string{"127.0.0.1:7946"}}, "gossip needs the cluster secret"},
		{"min past max", Config{Key: key, Listen: "127.0.0.1:7000", MinWorkers: 5, MaxWorkers: 4}, "MinWorkers 5"},
		{"max past view", Config{Key: key, Listen: "127.0.0.1:7000", MaxWorkers: MaxView + 1}, "MaxWorkers"},
		{"gossip timing", Config{Key: key, Listen: "127.0.0.1:7000", GossipTiming: "wan"}, "GossipTiming"},
		{"balance", Config{Key: key, Balance: "fastest"}, `Balance "fastest"`},
		{"ring order", Config{Key: key, RingOrder: "random"}, `RingOrder "random"`},
		{"algo", Config{Key: key, Algo: "tree"}, `Algo "tree"`},
		{"advertise with port", Config{Key: key, Advertise: "10.0.0.1:9100"}, "host only"},
		{"min workers past world", Config{Key: key, MinWorkers: 2}, "MinWorkers 2"},
		{"zero batch by shares", Config{Key: key, Shares: []int{0}}, "GlobalBatch 0"},
		{"fixed shares", Config{Key: key, Peers: peers3, Rank: 2, Shares: []int{5, 0, 3}}, ""},
		{"shares sum", Config{Key: key, Peers: peers3, Rank: 2, Shares: []int{5, 0, 3}, GlobalBatch: 9}, "sum to 8"},
		{"negative share", Config{Key: key, Peers: peers3, Rank: 2, Shares: []int{5, -1, 3}, GlobalBatch: 7}, "Shares[1] = -1"},
		{"shares count", Config{Key: key, Peers: peers3, Rank: 2, Shares: []int{5, 3}}, "Shares lists 2"},
		{"negative dataset", Config{Key: key, DatasetSize: -5}, "DatasetSize"},
		{"negative bucket", Config{Key: key, BucketBytes: -1}, "BucketBytes"},
		{"bad compression", Config{Key: key, Compress: "int8"}, `Compress "int8"`},
		{"compression", Config{Key: key, Compress: "bf16"}, ""},
		{"negative collective timeout", Config{Key: key, CollectiveTimeout: -time.Second}, "CollectiveTimeout"},
		{"peer timeout too short", Config{Key: key, PeerTimeout: time.Millisecond}, "PeerTimeout 1ms"},
		{"negative connect timeout", Config{Key: key, ConnectTimeout: -time.Second}, "ConnectTimeout"},
		// A gossiping worker's settings are checked as a static one's are.
		{"gossip bad compression", Config{Key: key, Seeds: []string{"127.0.0.1:7946"}, Compress: "int8"}, `Compress "int8"`},
		{"gossip peer timeout", Config{Key: key, Listen: "127.0.0.1:7000", PeerTimeout: time.Millisecond}, "PeerTimeout 1ms"},
		{"gossip negative bucket", Config{Key: key, Listen: "127.0.0.1:7000", BucketBytes: -1}, "BucketBytes"},
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
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want ErrConfig mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestValidateReportsEveryFault(t *testing.T) {
	err := Config{Transport: "x", Stripes: 99, Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}}.Validate()
	for _, want := range []string{"Transport", "Stripes", "secret"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate = %v, want it to mention %s", err, want)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		EnvTransport: "tcp", EnvInsecure: "true", EnvStripes: " 4 ",
		EnvKeyFile: "/k", EnvListen: "127.0.0.1:9000", EnvDataAddr: "127.0.0.1:9100",
		EnvAdvertise: "10.0.0.1", EnvName: "w3", EnvJob: "j", EnvMaxWorkers: "9",
		EnvGossipTiming: "local", EnvGossipProbeInterval: "3s", EnvGossipSuspicionMult: "6",
		EnvPeers: "127.0.0.1:9100, 127.0.0.1:9200", EnvRank: "1", EnvWorldSize: "2", EnvLocalRank: "1",
		EnvSeed: "10.0.0.1:7946,,10.0.0.2:7946", EnvMinWorkers: "2",
		EnvCollectiveTimeout: "90s", EnvPeerTimeout: " 500ms", EnvJoinTimeout: "1m", EnvBalance: "static",
		EnvConnectTimeout: "45s",
		EnvRingOrder:      "fixed", EnvAlgo: "doubling",
		EnvCheckpointDir: "/ckpt", EnvCheckpointEvery: "20", EnvCheckpointKeep: "5", EnvCheckpointRequired: "true",
	}
	c, err := ConfigFromEnv(mapLookup(env))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Name: "w3", Transport: "tcp", Insecure: true, Stripes: 4, KeyFile: "/k",
		Listen: "127.0.0.1:9000", DataAddr: "127.0.0.1:9100", Advertise: "10.0.0.1", Job: "j", MaxWorkers: 9,
		GossipTiming: "local", GossipProbeInterval: 3 * time.Second, GossipSuspicionMult: 6,
		Peers: []string{"127.0.0.1:9100", "127.0.0.1:9200"}, Rank: 1, WorldSize: 2, LocalRank: 1,
		Seeds: []string{"10.0.0.1:7946", "10.0.0.2:7946"}, MinWorkers: 2,
		CollectiveTimeout: 90 * time.Second, PeerTimeout: 500 * time.Millisecond, JoinTimeout: time.Minute,
		ConnectTimeout: 45 * time.Second, Balance: BalanceStatic, RingOrder: RingOrderFixed, Algo: AlgoDoubling,
		CheckpointDir: "/ckpt", CheckpointEvery: 20, CheckpointKeep: 5, CheckpointRequired: true}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("ConfigFromEnv:\n got %+v\nwant %+v", c, want)
	}
	if c, err := ConfigFromEnv(mapLookup(nil)); err != nil || !reflect.DeepEqual(c, Config{}) {
		t.Fatalf("empty environment gave %+v, %v", c, err)
	}
}

func TestConfigFromEnvRejectsMalformed(t *testing.T) {
	_, err := ConfigFromEnv(mapLookup(map[string]string{EnvInsecure: "maybe", EnvStripes: "two", EnvRank: "first",
		EnvPeerTimeout: "soon", EnvCheckpointEvery: "often", EnvCheckpointRequired: "yes please"}))
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v, want ErrConfig", err)
	}
	for _, name := range []string{EnvInsecure, EnvStripes, EnvRank, EnvPeerTimeout, EnvCheckpointEvery, EnvCheckpointRequired} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
}

func TestConfigSecret(t *testing.T) {
	key := testKey(t)
	s, err := Config{Key: key}.Secret()
	if err != nil || s.Hex() != key {
		t.Fatalf("Secret from Key = %v, %v", s, err)
	}
	if _, err := (Config{KeyFile: "/nonexistent/key"}).Secret(); err == nil {
		t.Fatal("missing key file gave no error")
	}
	if s, err := (Config{}).Secret(); err != nil || !s.IsZero() {
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
		c    Config
		want string
	}{
		{Config{}, BalanceLBBSP},
		{Config{Peers: peers, Shares: []int{3, 5}}, BalanceStatic},
		{Config{Peers: peers, Shares: []int{3, 5}, Balance: BalanceLBBSP}, BalanceLBBSP},
		{Config{Balance: BalanceStatic}, BalanceStatic},
	} {
		if got := tt.c.WithDefaults().Balance; got != tt.want {
			t.Errorf("%+v: Balance %q, want %q", tt.c, got, tt.want)
		}
	}
}

// TestValidateReportsOnlyTheRootCause: a field derived from a bad one is
// not reported as well, so the user reads about the flag they set.
func TestValidateReportsOnlyTheRootCause(t *testing.T) {
	key := testKey(t)
	for _, tt := range []struct {
		name string
		cfg  Config
		want string   // the one error
		not  []string // fields derived from it
	}{
		{"negative batch", Config{Key: key, GlobalBatch: -5}, "GlobalBatch -5", []string{"Shares"}},
		{"negative batch, static view", Config{Key: key, GlobalBatch: -5, Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}},
			"GlobalBatch -5", []string{"Shares"}},
		{"bad listen", Config{Key: key, Listen: "nonsense"}, `Listen "nonsense"`, []string{"Advertise", "DataAddr"}},
		{"bad peer", Config{Key: key, Peers: []string{"nonsense", "127.0.0.1:2"}}, `Peers[0] "nonsense"`, []string{"Advertise", "DataAddr"}},
		// A derived address that is bad although its source is fine is
		// still reported, naming the derived field.
		{"listen at the last port", Config{Key: key, Listen: "127.0.0.1:65535"}, `DataAddr "127.0.0.1:65536"`, []string{"Advertise"}},
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
	c, err := ConfigFromEnv(env(nil))
	if err != nil || c.Logger != nil {
		t.Fatalf("no log variables: Logger %v, err %v; want nil, the default", c.Logger, err)
	}
	c, err = ConfigFromEnv(env(map[string]string{EnvLogLevel: "info", EnvLogFormat: "json"}))
	if err != nil || c.Logger == nil || c.Logger.GetLevel() != zerolog.InfoLevel {
		t.Fatalf("GYRE_LOG_LEVEL=info: Logger %v, err %v; want one at info", c.Logger, err)
	}
	c, err = ConfigFromEnv(env(map[string]string{EnvLogFormat: "console"}))
	if err != nil || c.Logger == nil || c.Logger.GetLevel() != zerolog.WarnLevel {
		t.Fatalf("GYRE_LOG_FORMAT alone: Logger %v, err %v; want one at warn", c.Logger, err)
	}
	if _, err = ConfigFromEnv(env(map[string]string{EnvLogLevel: "loud"})); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), EnvLogLevel) {
		t.Fatalf("GYRE_LOG_LEVEL=loud: %v, want ErrConfig naming the variable", err)
	}
}
