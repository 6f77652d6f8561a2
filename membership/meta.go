package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Role is what a node is in the job.
type Role uint8

// Roles.
const (
	RoleWorker   Role = iota + 1 // a worker: it may enter views
	RoleObserver                 // an observer (gyre members): never in a view
)

func (r Role) String() string {
	switch r {
	case RoleWorker:
		return "worker"
	case RoleObserver:
		return "observer"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// metaVersion is the encoding's version, its first byte. A node that reads
// a version it does not know reports the member's metadata as unreadable.
const metaVersion = 1

// MaxMeta is the largest encoded Meta: memberlist's limit on node metadata.
const MaxMeta = 512

// ErrMeta is wrapped by errors about metadata that cannot be encoded or
// decoded.
var ErrMeta = errors.New("membership: bad node metadata")

// Meta is what a node tells the others about itself through gossip.
type Meta struct {
	// DataAddr is the data-plane address the transport bound (its Addr,
	// not the flag: port 0 is allowed).
	DataAddr string
	// Job names the job; nodes of other jobs are ignored.
	Job string
	// Protocol is the Gyre protocol version the node speaks.
	Protocol uint16
	Role     Role
	// Epoch and Rank are the node's current view and rank in it (Rank -1:
	// in no view).
	Epoch uint64
	Rank  int32
	// Device is the device probe's summary, such as "cpu:2".
	Device string
	// Started says the node's job has run iteration 0: its view is past
	// assembling. A view still assembling yields to a started one of the
	// same job (one job per key and name).
	Started bool
	// Lead names the node's view in the merge of started views of one
	// job (internal/merge), and Commit is the committed iteration that
	// view last published. Empty and 0 outside a started view.
	Lead   string
	Commit int64
	// Status is the job as this worker saw it when its view last
	// published Commit (gyre status); zero outside a started view.
	Status Status
}

// Status is a worker's part of its job's status, for gyre status: what
// its view's boundary table said when it last published its commit.
type Status struct {
	// Share is this worker's share of Global, the global batch; Global 0
	// means no status yet.
	Share, Global int32
	// Rate is this worker's samples/s over its compute time (what the
	// balance solver evens out); JobRate the job's, the global batch over
	// rank 0's time between boundaries.
	Rate, JobRate float32
	// Loss is the loss its trainer last reported (Worker.ReportLoss), if
	// HasLoss.
	Loss    float32
	HasLoss bool
}

// statusSize is an encoded Status: a flags byte (HasLoss), then Share,
// Global, Rate, JobRate and Loss, 4 bytes each.
const statusSize = 1 + 5*4

// Flags of the encoding's last byte.
const metaStarted = 1

// MarshalBinary encodes m: the version, then fixed fields, then the
// strings, each with a one-byte length, then a byte of flags (Started),
// then Commit and Lead, then Status. The fields after the strings came
// later: an encoding that ends before one reads it as zero.
func (m Meta) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, 64)
	b = append(b, metaVersion, byte(m.Role))
	b = binary.LittleEndian.AppendUint16(b, m.Protocol)
	b = binary.LittleEndian.AppendUint64(b, m.Epoch)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Rank))
	for _, s := range []string{m.DataAddr, m.Job, m.Device} {
		if len(s) > 255 {
			return nil, fmt.Errorf("%w: a field of %d bytes, at most 255", ErrMeta, len(s))
		}
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	var flags byte
	if m.Started {
		flags |= metaStarted
	}
	b = append(b, flags)
	if m.Lead != "" || m.Commit != 0 || m.Status.Global != 0 {
		if len(m.Lead) > 255 {
			return nil, fmt.Errorf("%w: a lead of %d bytes, at most 255", ErrMeta, len(m.Lead))
		}
		b = binary.LittleEndian.AppendUint64(b, uint64(m.Commit))
		b = append(b, byte(len(m.Lead)))
		b = append(b, m.Lead...)
	}
	if s := m.Status; s.Global != 0 {
		var flags byte
		if s.HasLoss {
			flags = 1
		}
		b = append(b, flags)
		b = binary.LittleEndian.AppendUint32(b, uint32(s.Share))
		b = binary.LittleEndian.AppendUint32(b, uint32(s.Global))
		for _, f := range []float32{s.Rate, s.JobRate, s.Loss} {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
		}
	}
	if len(b) > MaxMeta && m.Status.Global != 0 {
		// The status is for people (gyre status); the rest is needed.
		m.Status = Status{}
		return m.MarshalBinary()
	}
	if len(b) > MaxMeta {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrMeta, len(b), MaxMeta)
	}
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary encoded.
func (m *Meta) UnmarshalBinary(b []byte) error {
	const fixed = 1 + 1 + 2 + 8 + 4
	if len(b) < fixed || len(b) > MaxMeta {
		return fmt.Errorf("%w: %d bytes", ErrMeta, len(b))
	}
	if b[0] != metaVersion {
		return fmt.Errorf("%w: version %d, this node reads %d", ErrMeta, b[0], metaVersion)
	}
	var out Meta
	out.Role = Role(b[1])
	out.Protocol = binary.LittleEndian.Uint16(b[2:])
	out.Epoch = binary.LittleEndian.Uint64(b[4:])
	out.Rank = int32(binary.LittleEndian.Uint32(b[12:]))
	rest := b[fixed:]
	for _, dst := range []*string{&out.DataAddr, &out.Job, &out.Device} {
		if len(rest) == 0 || len(rest) < 1+int(rest[0]) {
			return fmt.Errorf("%w: truncated", ErrMeta)
		}
		*dst, rest = string(rest[1:1+int(rest[0])]), rest[1+int(rest[0]):]
	}
	if len(rest) > 0 {
		out.Started = rest[0]&metaStarted != 0
		rest = rest[1:]
	}
	if len(rest) > 0 {
		if len(rest) < 9 || len(rest) < 9+int(rest[8]) {
			return fmt.Errorf("%w: truncated", ErrMeta)
		}
		out.Commit = int64(binary.LittleEndian.Uint64(rest))
		out.Lead, rest = string(rest[9:9+int(rest[8])]), rest[9+int(rest[8]):]
	}
	if len(rest) > 0 {
		if len(rest) < statusSize {
			return fmt.Errorf("%w: truncated", ErrMeta)
		}
		s := &out.Status
		s.HasLoss = rest[0]&1 != 0
		s.Share = int32(binary.LittleEndian.Uint32(rest[1:]))
		s.Global = int32(binary.LittleEndian.Uint32(rest[5:]))
		s.Rate = math.Float32frombits(binary.LittleEndian.Uint32(rest[9:]))
		s.JobRate = math.Float32frombits(binary.LittleEndian.Uint32(rest[13:]))
		s.Loss = math.Float32frombits(binary.LittleEndian.Uint32(rest[17:]))
		// Bytes after it are a later version's fields: skipped, as the
		// fields above are zero in an earlier encoding.
	}
	*m = out
	return nil
}
