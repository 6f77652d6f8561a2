package vote

import "github.com/gyre-ml/gyre/balance"

// Record kinds: a table mixing kinds means workers are at different points
// of the protocol.
const (
	KindSettings = 1 + iota // Join: state layout and batch settings
	KindSynced              // Join: the state broadcast's outcome
	KindBoundary            // Boundary
	KindAdmit               // Join: admitting workers before iteration 0
	KindResume              // Join: the newest checkpoint each worker holds, and loading it
)

// Version is the record's layout version. It grows when fields are added,
// which also changes Len.
const Version = 8

// Sizes of the record's fixed arrays.
const (
	JoinerSlots = 8 // pending joiners listed per boundary
	spareWords  = 0 // room for further fields (grow Len and the version)
)

// Len is the encoded record's length in int64 words.
const Len = 26 + JoinerSlots + spareWords

// Record is one worker's row of a vote. Every worker sends the same
// fixed-size encoding, as the ring allgather needs equal contributions.
type Record struct {
	Kind  int64
	Iter  int64
	Share int64
	// Compute is the iteration's compute time in ns (Batch to Wait).
	Compute int64
	// Decision digests the view and shares this worker will use next, or
	// at Join the settings that must never differ.
	Decision uint64
	// Status is StatusOK if every collective of the iteration completed,
	// else the failure's class.
	Status int64
	// Digest is the state digest (0: not checked at this vote), HashNs the
	// time it took.
	Digest uint64
	HashNs int64
	// Layout is the state layout (Join only).
	Layout uint64
	// Wall is the wall time in ns since the previous boundary (or Join):
	// the iteration time that the state check's budget is a share of.
	Wall int64
	// Leave says this worker asked to leave at this boundary.
	Leave bool
	// MinWorkers and MaxWorkers are this worker's Config bounds.
	MinWorkers, MaxWorkers int64
	// Joiners are hashes (JoinerHash) of the pending workers this worker
	// may list: its admission handshake with each is done; 0 marks an
	// empty slot.
	Joiners [JoinerSlots]uint64
	// Model is this worker's fitted compute model (zero: none yet), and
	// SpeedChanged says its estimator saw its speed change.
	Model        balance.Model
	SpeedChanged bool
	// MinShare and MaxShare bound this worker's share (MaxShare 0: no cap
	// of its own). MaxShare comes from Headroom, the device memory in
	// bytes this worker's batch may take (0: unknown).
	MinShare, MaxShare int64
	Headroom           int64
	// Epoch is the job epoch of the newest checkpoint this worker holds
	// (KindResume; its iteration is in Iter, its checksum in Digest), and
	// DirEpoch the highest any file of its directory names, valid or not.
	Epoch, DirEpoch uint64
	// CkptFailed says a checkpoint of this worker's could not be written
	// and it runs with CheckpointRequired (KindBoundary): the job ends.
	CkptFailed bool
	// MergeTo is the LeadHash of the started view of the job this worker
	// judges its view must yield to (merge.Judge; 0: stay), and
	// MergeCommit that view's committed iteration as it sees it.
	MergeTo     uint64
	MergeCommit int64
}

// Encode returns r's fixed-size row.
func (r *Record) Encode() []int64 {
	row := make([]int64, 0, Len)
	row = append(row, Version<<8|r.Kind, r.Iter, r.Share, r.Compute, int64(r.Decision),
		r.Status, int64(r.Digest), r.HashNs, int64(r.Layout), r.Wall, boolInt(r.Leave), r.MinWorkers, r.MaxWorkers,
		r.Model.FixedNs, r.Model.RateMicro, boolInt(r.SpeedChanged), r.MinShare, r.MaxShare)
	for _, j := range r.Joiners {
		row = append(row, int64(j))
	}
	row = append(row, r.Headroom, boolInt(r.Model.Flat), int64(r.Epoch), int64(r.DirEpoch), boolInt(r.CkptFailed), r.Model.NoisePpm,
		int64(r.MergeTo), r.MergeCommit)
	return row[:Len]
}

// Decode reads a row Encode wrote, and returns the version it says.
func Decode(row []int64) (Record, int64) {
	r := Record{Kind: row[0] & 0xff, Iter: row[1], Share: row[2], Compute: row[3], Decision: uint64(row[4]),
		Status: row[5], Digest: uint64(row[6]), HashNs: row[7], Layout: uint64(row[8]), Wall: row[9],
		Leave: row[10] != 0, MinWorkers: row[11], MaxWorkers: row[12],
		Model: balance.Model{FixedNs: row[13], RateMicro: row[14]}, SpeedChanged: row[15] != 0,
		MinShare: row[16], MaxShare: row[17]}
	for i := range r.Joiners {
		r.Joiners[i] = uint64(row[18+i])
	}
	r.Headroom = row[18+JoinerSlots]
	r.Model.Flat = row[19+JoinerSlots] != 0
	r.Epoch, r.DirEpoch = uint64(row[20+JoinerSlots]), uint64(row[21+JoinerSlots])
	r.CkptFailed = row[22+JoinerSlots] != 0
	r.Model.NoisePpm = row[23+JoinerSlots]
	r.MergeTo, r.MergeCommit = uint64(row[24+JoinerSlots]), row[25+JoinerSlots]
	return r, row[0] >> 8
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Statuses in a record: how the iteration's collectives ended on a rank.
const (
	StatusOK = iota
	StatusOther
	StatusMismatch
	StatusPeerGone
	StatusTimeout
	StatusCanceled
	StatusClosed
)

var statusNames = [...]string{StatusOK: "ok", StatusOther: "other", StatusMismatch: "mismatch",
	StatusPeerGone: "peer gone", StatusTimeout: "timeout", StatusCanceled: "canceled", StatusClosed: "closed"}

// StatusName names a failed status, as IterationError's Reasons do.
func StatusName(s int64) string {
	if s > StatusOK && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "other"
}
