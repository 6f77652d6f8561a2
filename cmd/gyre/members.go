package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/membership"
)

// membersLeaveTimeout bounds the observer's goodbye.
const membersLeaveTimeout = time.Second

func newMembersCmd(c *cli) *cobra.Command {
	var (
		of     observerFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "members --seed ADDR [--seed ADDR]... [--key-file F] [--json]",
		Short: "List a job's members as gossip sees them",
		Long: "members joins a job's gossip as an observer, which views ignore, waits\n" +
			"--wait for gossip to settle, prints every member it learnt of, then\n" +
			"leaves. A seed is the gossip address of any live member (gyre launch\n" +
			"prints one), and the cluster secret must be the job's: --key-file, or\n" +
			"GYRE_KEY_FILE or GYRE_KEY. Each line gives the member's name, gossip\n" +
			"and data addresses, state (alive, suspect, dead or left), role, epoch,\n" +
			"rank and device, and \"pending\" for a live worker that no view has\n" +
			"admitted yet. Members that died or left recently are listed too, as far\n" +
			"as the seed still remembers them. Rows are sorted by rank, members\n" +
			"with none last, then by name.",
		Example: "  gyre members --seed 127.0.0.1:7946 --key-file cluster.key\n" +
			"  GYRE_KEY_FILE=cluster.key gyre members --seed 10.0.0.5:7946 --json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ms, err := of.observe(cmd.Context(), c)
			if err != nil {
				return err
			}
			rows := memberRows(ms)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			return writeMemberTable(cmd.OutOrStdout(), rows)
		},
	}
	of.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array instead of a table")
	return cmd
}

// observerFlags are how gyre members and gyre status reach a job's gossip.
type observerFlags struct {
	seeds       []string
	keyFile     string
	listen      string
	wait        time.Duration
	joinTimeout time.Duration
}

func (of *observerFlags) bind(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringSliceVar(&of.seeds, "seed", nil, "gossip address (host:port) of a live member; repeat or comma-separate for several (default $"+gyre.EnvSeed+")")
	f.StringVar(&of.keyFile, "key-file", "", "the job's cluster secret (default $"+gyre.EnvKeyFile+" or $"+gyre.EnvKey+")")
	f.StringVar(&of.listen, "listen", "127.0.0.1:0", "gossip address to bind, host:port with an explicit host; port 0 picks a free one")
	f.DurationVar(&of.wait, "wait", 2*time.Second, "how long to let gossip settle after joining")
	f.DurationVar(&of.joinTimeout, "join-timeout", 10*time.Second, "give up joining after this long")
}

// observe checks the flags, joins the job's gossip as an observer and
// returns every member it learnt of (observe).
func (of *observerFlags) observe(ctx context.Context, c *cli) ([]membership.Member, error) {
	cfg, err := gyre.ConfigFromEnv(c.env.lookup)
	if err != nil {
		return nil, err
	}
	seeds := of.seeds
	if len(seeds) == 0 {
		seeds = cfg.Seeds
	}
	if len(seeds) == 0 {
		return nil, errors.New("no seed to join: give --seed HOST:PORT, the gossip address of any live member " +
			"of the job (gyre launch prints one), or set " + gyre.EnvSeed)
	}
	key, err := membersSecret(of.keyFile, cfg)
	if err != nil {
		return nil, err
	}
	if of.wait < 0 || of.joinTimeout <= 0 {
		return nil, errors.New("--wait must not be negative and --join-timeout must be positive")
	}
	return observe(ctx, c, observeOptions{seeds: seeds, key: key, listen: of.listen, wait: of.wait, joinTimeout: of.joinTimeout})
}

// membersSecret loads the cluster secret from --key-file, else from the
// environment. It never makes one: a new secret could not join the job.
func membersSecret(keyFile string, cfg gyre.Config) (secret.Secret, error) {
	if keyFile != "" {
		s, err := secret.Load(keyFile)
		if err != nil {
			return secret.Secret{}, fmt.Errorf("--key-file: %w", err)
		}
		return s, nil
	}
	if cfg.Key == "" && cfg.KeyFile == "" {
		return secret.Secret{}, errors.New("a cluster secret is required to read a job's gossip: give --key-file FILE " +
			"(the job's key file, as gyre launch prints it) or set " + gyre.EnvKeyFile + " or " + gyre.EnvKey +
			"; it never makes one, since another secret cannot join the job")
	}
	s, err := cfg.Secret()
	if err != nil {
		return secret.Secret{}, fmt.Errorf("%s/%s: %w", gyre.EnvKeyFile, gyre.EnvKey, err)
	}
	return s, nil
}

type observeOptions struct {
	seeds       []string
	key         secret.Secret
	listen      string
	wait        time.Duration
	joinTimeout time.Duration
}

// observe joins the seeds' gossip as an observer, waits o.wait, and
// returns every member it learnt of but itself. It leaves before it
// returns.
func observe(ctx context.Context, c *cli, o observeOptions) ([]membership.Member, error) {
	name := "observer-" + strings.ToLower(rand.Text()[:10])
	node, err := membership.Start(membership.Config{Name: name, Listen: o.listen, Key: o.key.GossipKey(), Local: true,
		Meta:   membership.Meta{Role: membership.RoleObserver, Rank: -1},
		Logger: c.log.With().Str("observer", name).Logger()})
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	jctx, cancel := context.WithTimeout(ctx, o.joinTimeout)
	err = node.Join(jctx, o.seeds)
	cancel()
	if err != nil && membership.Unreachable(err) {
		node.Close()
		return nil, err
	}
	if err != nil {
		node.Close()
		return nil, fmt.Errorf("%w\ncheck that %s is the gossip address of a live member of the job, and that the "+
			"job's cluster secret is this one (fingerprint %s): the secret may differ",
			err, strings.Join(o.seeds, ", "), o.key.Fingerprint())
	}
	select {
	case <-time.After(o.wait):
	case <-ctx.Done(): // interrupted: report what is known so far
	}
	var out []membership.Member
	for _, m := range node.All() {
		if m.Name != name {
			out = append(out, m)
		}
	}
	if err := node.Leave(membersLeaveTimeout); err != nil {
		c.log.Debug().Err(err).Msg("leaving gossip")
	}
	return out, nil
}

// memberRow is one member as printed; the JSON keys are the interface.
type memberRow struct {
	ID         string `json:"id"`
	GossipAddr string `json:"gossip_addr"`
	DataAddr   string `json:"data_addr"`
	State      string `json:"state"`
	Role       string `json:"role"`
	Epoch      uint64 `json:"epoch"`
	Rank       int32  `json:"rank"`
	Device     string `json:"device"`
	// Pending marks a live worker that no view has admitted yet.
	Pending bool `json:"pending"`
	// MetaError says why the member's metadata could not be read.
	MetaError string `json:"meta_error,omitempty"`
}

// memberRows turns members into rows sorted by rank, rankless ones last,
// then by name.
func memberRows(ms []membership.Member) []memberRow {
	rows := make([]memberRow, 0, len(ms))
	for _, m := range ms {
		r := memberRow{ID: m.Name, GossipAddr: m.Addr, DataAddr: m.Meta.DataAddr, State: m.State.String(),
			Role: m.Meta.Role.String(), Epoch: m.Meta.Epoch, Rank: m.Meta.Rank, Device: m.Meta.Device}
		if m.MetaErr != nil {
			r.Role, r.Rank, r.MetaError = "unknown", -1, m.MetaErr.Error()
		}
		r.Pending = m.MetaErr == nil && m.Meta.Role == membership.RoleWorker && m.State.Live() &&
			(m.Meta.Rank < 0 || m.Meta.Epoch == 0)
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b memberRow) int {
		return cmp.Or(cmp.Compare(rankKey(a.Rank), rankKey(b.Rank)), strings.Compare(a.ID, b.ID))
	})
	return rows
}

// rankKey orders ranks with "none" (negative) after every real rank.
func rankKey(r int32) int64 {
	if r < 0 {
		return 1 << 32
	}
	return int64(r)
}

// writeMemberTable prints rows under a header, "-" for empty cells.
func writeMemberTable(w io.Writer, rows []memberRow) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tGOSSIP\tDATA\tSTATE\tROLE\tEPOCH\tRANK\tDEVICE\tNOTE")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, r := range rows {
		rank := "-"
		if r.Rank >= 0 {
			rank = strconv.Itoa(int(r.Rank))
		}
		note := ""
		switch {
		case r.MetaError != "":
			note = "unreadable metadata: " + r.MetaError
		case r.Pending:
			note = "pending"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, dash(r.GossipAddr), dash(r.DataAddr), r.State,
			r.Role, r.Epoch, rank, dash(r.Device), dash(note))
	}
	return tw.Flush()
}
