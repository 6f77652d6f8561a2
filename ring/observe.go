package ring

import (
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
)

// Observer is told of every collective a Comm runs, when it ends, on the
// caller's goroutine. It must be quick and must not block: the next
// collective waits for it. Implementations that keep counters should not
// allocate, so that the allreduce stays allocation-free with one
// installed.
type Observer interface {
	Collective(CollectiveStats)
}

// CollectiveStats describes one collective as this rank saw it.
type CollectiveStats struct {
	// Algo names the collective and how it ran (see Algo.Op).
	Algo Algo
	// Bytes is the caller's buffer, before any compression.
	Bytes int
	// Ranks is the number of members the collective ran among.
	Ranks int
	// Wire is the compression on the wire: wire.DTypeBytes for none.
	Wire wire.DType
	// Duration runs from the call to its return, waiting for the Comm
	// included.
	Duration time.Duration
	// Err is the collective's error, nil on success.
	Err error
}

// BucketObserver is told of every non-empty bucket a Fuser runs, when it
// ends, on the Fuser's goroutine. It must be quick: the next bucket waits.
type BucketObserver interface {
	Bucket(BucketStats)
}

// BucketStats describes one bucket: its tensors and the times of its
// phases. A bucket waits in the queue from Closed to Started, is copied
// into the contiguous buffer until Packed, allreduced until Reduced, and
// copied back until Done (Done equals Reduced's time if it failed).
type BucketStats struct {
	// Tensors are the names of the bucket's tensors in submission order.
	// The slice is reused once Bucket returns.
	Tensors []string
	// Bytes is the bucket's size in memory, before any compression.
	Bytes                                  int
	Closed, Started, Packed, Reduced, Done time.Time
	// Err is the collective's error, nil on success.
	Err error
}

// Operations, as Algo.Op names them.
const (
	OpAllReduce     = "allreduce"
	OpReduceScatter = "reduce_scatter"
	OpAllGather     = "allgather"
	OpBroadcast     = "broadcast"
	OpBarrier       = "barrier"
)

// Op is the operation a collective of algorithm a performs: allreduce
// for the ring and recursive doubling, and so on; "" for AlgoNone and
// unknown values.
func (a Algo) Op() string {
	switch a {
	case AlgoRing, AlgoRecursiveDoubling, AlgoHierarchical:
		return OpAllReduce
	case AlgoRingReduceScatter:
		return OpReduceScatter
	case AlgoRingAllGather:
		return OpAllGather
	case AlgoRingBroadcast:
		return OpBroadcast
	case AlgoBarrier:
		return OpBarrier
	}
	return ""
}
