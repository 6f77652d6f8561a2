package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre/membership"
)

func newStatusCmd(c *cli) *cobra.Command {
	var (
		of     observerFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status --seed ADDR [--seed ADDR]... [--key-file F] [--json]",
		Short: "Show a running job as a whole: its view, shares, speed and progress",
		Long: "status joins a job's gossip as an observer, as gyre members does, and\n" +
			"prints the job as its workers last published it: for each job (--job\n" +
			"name) its view's epoch, committed iteration, workers, global batch,\n" +
			"samples/s and loss; then each rank with its state, share of the\n" +
			"batch, samples/s over its compute time and loss; then the workers\n" +
			"waiting to be admitted and the members gossip still remembers that\n" +
			"are out of the view (dead or left). The workers refresh what they\n" +
			"publish every 2 s at a boundary, so the figures lag by up to that\n" +
			"and --wait. A warning line says when gossip shows two views of one\n" +
			"job (a partition healed, or two jobs of one name started apart),\n" +
			"which merge at a boundary (docs/membership.md). Any member's gossip\n" +
			"address serves as the seed, and the cluster secret must be the job's.",
		Example: "  gyre status --seed 127.0.0.1:7946 --key-file cluster.key\n" +
			"  GYRE_KEY_FILE=cluster.key gyre status --seed 10.0.0.5:7946 --json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ms, err := of.observe(cmd.Context(), c)
			if err != nil {
				return err
			}
			jobs := jobStatuses(ms)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(jobs)
			}
			return writeJobStatuses(cmd.OutOrStdout(), jobs)
		},
	}
	of.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of jobs instead of tables")
	return cmd
}

// jobStatus is one job as gyre status prints it; the JSON keys are the
// interface.
type jobStatus struct {
	Job string `json:"job"`
	// Epoch is the view's, and Iteration the highest committed iteration
	// its members last published.
	Epoch     uint64 `json:"epoch"`
	Iteration int64  `json:"iteration"`
	// GlobalBatch and SamplesPerSec are the job's at that boundary (0:
	// not published yet); Loss the trainer's, if it reports one.
	GlobalBatch   int          `json:"global_batch"`
	SamplesPerSec float64      `json:"samples_per_sec"`
	Loss          *float64     `json:"loss,omitempty"`
	Ranks         []rankStatus `json:"ranks"`
	// Pending are live workers no view has admitted; Gone are members out
	// of the view that gossip remembers as dead or left.
	Pending []memberRow `json:"pending"`
	Gone    []memberRow `json:"gone"`
	// Warnings says what looks wrong: two views of one job, members still
	// in an older view.
	Warnings []string `json:"warnings"`
}

// rankStatus is one member of the view.
type rankStatus struct {
	Rank          int32    `json:"rank"`
	ID            string   `json:"id"`
	GossipAddr    string   `json:"gossip_addr"`
	DataAddr      string   `json:"data_addr"`
	State         string   `json:"state"`
	Share         int      `json:"share"`
	SamplesPerSec float64  `json:"samples_per_sec"`
	Loss          *float64 `json:"loss,omitempty"`
	Device        string   `json:"device"`
}

// jobStatuses assembles each job's status from the members' gossip
// metadata, jobs by name. A job's view is the one its live workers
// publish, by lead; where gossip shows two, the one with the higher
// committed iteration (then the more members) is shown, and a warning
// names the others.
func jobStatuses(ms []membership.Member) []jobStatus {
	byJob := map[string][]membership.Member{}
	for _, m := range ms {
		if m.MetaErr == nil && m.Meta.Role == membership.RoleWorker {
			byJob[m.Meta.Job] = append(byJob[m.Meta.Job], m)
		}
	}
	jobs := make([]jobStatus, 0, len(byJob))
	for name, members := range byJob {
		jobs = append(jobs, oneJob(name, members))
	}
	slices.SortFunc(jobs, func(a, b jobStatus) int { return strings.Compare(a.Job, b.Job) })
	return jobs
}

// viewSight is one view of a job as gossip shows it: its live members.
type viewSight struct {
	lead    string
	epoch   uint64
	commit  int64
	members []membership.Member
}

func oneJob(name string, members []membership.Member) jobStatus {
	js := jobStatus{Job: name, Ranks: []rankStatus{}, Pending: []memberRow{}, Gone: []memberRow{}, Warnings: []string{}}
	views := map[string]*viewSight{}
	for _, m := range members {
		switch {
		case !m.State.Live():
			js.Gone = append(js.Gone, memberRows([]membership.Member{m})...)
		case m.Meta.Epoch == 0 || m.Meta.Rank < 0:
			js.Pending = append(js.Pending, memberRows([]membership.Member{m})...)
		default:
			v := views[m.Meta.Lead]
			if v == nil {
				v = &viewSight{lead: m.Meta.Lead}
				views[m.Meta.Lead] = v
			}
			v.epoch, v.commit = max(v.epoch, m.Meta.Epoch), max(v.commit, m.Meta.Commit)
			v.members = append(v.members, m)
		}
	}
	sights := make([]*viewSight, 0, len(views))
	for _, v := range views {
		sights = append(sights, v)
	}
	slices.SortFunc(sights, func(a, b *viewSight) int {
		return cmp.Or(cmp.Compare(b.commit, a.commit), cmp.Compare(len(b.members), len(a.members)), strings.Compare(a.lead, b.lead))
	})
	if len(sights) == 0 {
		return js
	}
	shown := sights[0]
	for _, v := range sights[1:] {
		js.Warnings = append(js.Warnings, fmt.Sprintf("gossip shows another view of job %q: workers %d at epoch %d, iteration %d (lead %s), beside the one shown (lead %s); started views of one job merge at a boundary, the one behind joining the other",
			name, len(v.members), v.epoch, v.commit, v.lead, shown.lead))
	}
	js.Epoch, js.Iteration = shown.epoch, shown.commit
	slices.SortFunc(shown.members, func(a, b membership.Member) int {
		return cmp.Or(cmp.Compare(a.Meta.Rank, b.Meta.Rank), strings.Compare(a.Name, b.Name))
	})
	var behind []string
	for _, m := range shown.members {
		st := m.Meta.Status
		r := rankStatus{Rank: m.Meta.Rank, ID: m.Name, GossipAddr: m.Addr, DataAddr: m.Meta.DataAddr, State: m.State.String(),
			Share: int(st.Share), SamplesPerSec: float64(st.Rate), Loss: lossOf(st), Device: m.Meta.Device}
		js.Ranks = append(js.Ranks, r)
		if m.Meta.Epoch < shown.epoch {
			behind = append(behind, fmt.Sprintf("rank %d %s at epoch %d", m.Meta.Rank, m.Name, m.Meta.Epoch))
			continue
		}
		if st.Global > 0 && (js.GlobalBatch == 0 || m.Meta.Rank == 0) {
			js.GlobalBatch, js.SamplesPerSec, js.Loss = int(st.Global), float64(st.JobRate), lossOf(st)
		}
	}
	if len(behind) > 0 {
		js.Warnings = append(js.Warnings, fmt.Sprintf("the view is changing: %s, the others at %d", strings.Join(behind, ", "), shown.epoch))
	}
	return js
}

// lossOf is a status's loss, nil if its trainer reports none, or one
// JSON cannot carry (NaN or infinite: a diverged job).
func lossOf(st membership.Status) *float64 {
	l := float64(st.Loss)
	if !st.HasLoss || st.Global == 0 || math.IsNaN(l) || math.IsInf(l, 0) {
		return nil
	}
	return &l
}

// writeJobStatuses prints each job as tables, in the style of kubectl
// get: the job's line, its ranks, then pending and gone members and
// warnings.
func writeJobStatuses(w io.Writer, jobs []jobStatus) error {
	if len(jobs) == 0 {
		_, err := fmt.Fprintln(w, "no workers in gossip")
		return err
	}
	for k, js := range jobs {
		if k > 0 {
			fmt.Fprintln(w)
		}
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tEPOCH\tITERATION\tWORKERS\tPENDING\tGLOBAL BATCH\tSAMPLES/S\tLOSS")
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", js.Job, js.Epoch, js.Iteration, len(js.Ranks), len(js.Pending),
			orDash(js.GlobalBatch > 0, strconv.Itoa(js.GlobalBatch)), rate(js.SamplesPerSec), loss(js.Loss))
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(js.Ranks) == 0 && len(js.Pending) == 0 {
			fmt.Fprintf(w, "no worker of job %q is running\n", js.Job)
		}
		if len(js.Ranks) > 0 {
			fmt.Fprintln(w)
			tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "RANK\tID\tSTATE\tSHARE\tSAMPLES/S\tLOSS\tDEVICE")
			for _, r := range js.Ranks {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Rank, r.ID, r.State, orDash(r.Share > 0, strconv.Itoa(r.Share)),
					rate(r.SamplesPerSec), loss(r.Loss), orDash(r.Device != "", r.Device))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		for _, p := range js.Pending {
			fmt.Fprintf(w, "pending: %s (gossip %s), waiting to be admitted at a boundary\n", p.ID, p.GossipAddr)
		}
		for _, g := range js.Gone {
			fmt.Fprintf(w, "out of the view: %s (gossip %s), %s\n", g.ID, g.GossipAddr, g.State)
		}
		for _, warn := range js.Warnings {
			fmt.Fprintf(w, "warning: %s\n", warn)
		}
	}
	return nil
}

func orDash(ok bool, s string) string {
	if !ok {
		return "-"
	}
	return s
}

// rate prints samples/s to the unit, with thousands separators.
func rate(r float64) string {
	if r <= 0 {
		return "-"
	}
	s := strconv.FormatInt(int64(r+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func loss(l *float64) string {
	if l == nil {
		return "-"
	}
	return strconv.FormatFloat(*l, 'g', 4, 64)
}
