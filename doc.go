// Package gyre is the embedding API of Gyre, a collective-communication
// runtime for data-parallel training with no parameter server.
//
// A trainer fills a Config (ConfigFromEnv reads the GYRE_* variables that
// `gyre launch` sets; BindFlags and BindPFlags add the usual flags), hands
// its state to Join, and loops over iterations on the Worker it gets back.
// Join connects the workers, checks that they registered the same state
// and batch settings, and broadcasts rank 0's state, so every worker
// starts identical. With gossip (Config.Seeds or Config.Listen) Join
// returns once a boundary has admitted the worker into the job's view,
// with the state of the members already there.
//
// # The iteration loop
//
// The package example (Example, below) is the loop every trainer
// follows, run as a test: Batch, then AllReduceAsync for each gradient as
// backward produces it, Wait, the optimizer step, Boundary, and Commit. It
// stays correct when the view or the shares change between iterations,
// because the Worker, not the trainer, owns the iteration number, the
// sampler and the committed state. After the loop, Leave ends the job on
// every worker.
//
// Gradients. The trainer passes each tensor's mean over its own bᵢ
// samples, as soon as backward produces it; the Worker weights it by bᵢ/B
// and sums over workers, so the result is the sample-weighted global mean
// whatever the shares. Tensors are fused into buckets by submission order
// and size and sent while backward continues, as in PyTorch DDP.
//
// Metrics. Reduce sums, averages or takes the maximum or minimum of a few
// float64 values over the view, each worker counting alike: a global loss
// (reduce loss·bᵢ with ReduceSum and divide by B), an accuracy, the
// slowest worker's time. Call it between Wait and Boundary on every
// worker, since a boundary may change the view.
//
// Lost workers. A worker killed, stopped or cut off makes Wait, Reduce
// and AllGather64 fail with a *PeerLostError naming its rank, and
// collectives run on Comm with an error that matches ErrPeerLost. None of
// that is fatal in a gossip job: the loop goes on to Boundary, where the
// survivors agree on a view without the lost workers, take the newest
// state any of them committed, and return a Change with Redo set, Lost
// naming the lost workers, and Iter the iteration to run, which may
// differ from the one just run. That takes a majority of the view:
// crash tolerance needs 3 or more workers. A worker cut off from the
// majority waits up to Config.QuorumTimeout, then fails with ErrNoQuorum.
// A static view (Config.Peers) stays fail-fast: Boundary returns the
// *PeerLostError. See docs/recovery.md.
//
// A worker alone (no Peers, Seeds or Listen) talks to no one: it binds no
// port and needs no cluster secret, so a trainer runs unchanged on one
// machine before it runs on many.
//
// Logs. With Config.Logger nil, warnings and errors go to stderr, so an
// unreachable seed or a silent peer is reported at once; every line names
// the worker's id and its current rank.
//
// Sampler. The data is an endless stream of seeded per-epoch permutations
// (Config.RNGSeed, Config.DatasetSize); iteration k's global batch is
// positions [k·B, (k+1)·B) of the stream, split by the shares in rank
// order, so no sample is lost or counted twice when shares change or an
// iteration is redone.
//
// Boundary. Every worker ends every iteration with a vote that all join,
// also a worker whose collectives failed: one allgather of a small record
// per worker on a control channel of its own, apart from the gradients.
// All judge the same table, so all return the same outcome: the next
// iteration, a Redo everywhere (a lost worker, or in a gossip job a first
// mismatch at an iteration), or the same error everywhere (an
// *IterationError naming the ranks whose collectives failed, ErrDiverged naming the ranks whose
// iteration, shares or state differ, or a *PeerLostError naming a worker
// that died or froze). The record carries a digest of the state about to
// be committed, checked at every boundary while hashing costs at most 1%
// of an iteration and every K iterations beyond. Before a worker returns a
// failed verdict, a barrier proves that every worker holds the table, so
// one that exits at once on the error (log.Fatal) cannot leave the others
// waiting for its last messages.
//
// Late is not dead. A peer that is slow to reach a collective (a GC pause,
// evaluation or a checkpoint on one rank, a straggler) is waited for up to
// Config.CollectiveTimeout (10 minutes); past it, in a gossip job, the
// others recover without it and it rejoins as a new member once it gets
// there. A peer whose process stops
// answering heartbeats, which travel on a channel of their own, is
// declared gone after Config.PeerTimeout (2 s): killed, stopped or cut off.
//
// State. Commit copies the registered tensors, metadata and the iteration
// aside; Restore and Abandon copy them back, as Horovod's elastic state
// does. An error in the trainer's own code midway through an iteration is
// handled by Abandon, on every worker, and running the iteration again;
// in a gossip job, even after a failed collective, which the next
// Boundary then recovers from.
//
// Views. A view is an epoch and its members in rank order. In the static
// view Config.Peers lists every worker's data-plane address in rank order,
// as `gyre launch --static` or an MPI-style launcher passes it, and it
// never changes. With gossip (hashicorp/memberlist, through package
// membership) workers find each other from one seed address, and the view
// changes at a Boundary, decided from the boundary's table by the same
// pure rule on every member, with no coordinator. Gossip only finds
// members: no difference between the members' gossip fails a boundary.
// The rule:
//   - a member whose record asks to leave (RequestLeave) is removed, with
//     no iteration redone; Change.Left tells the leaver, Change.Departed
//     the others; the leaver closes once the others have said farewell;
//   - a pending joiner is admitted when every member's record lists it and
//     Config.MaxWorkers leaves room. A member lists it only after an
//     admission handshake on a channel of its own: the joiner dialled the
//     member and sent its settings and state layout, the member dialled
//     it back and found that it fits. A joiner that does not fit is
//     refused, its Join failing with ErrDiverged that names the
//     difference; one that cannot be reached stays pending. The members
//     then welcome it over the control channel (epoch, members, iteration,
//     shares) within Config.ConnectTimeout, one of them broadcasts the
//     committed state, and Change.Admitted names it;
//   - iteration 0 waits until the view holds Config.MinWorkers; later
//     leaves may shrink it below that;
//   - members are sorted by data address (host, then port); a changed view
//     has the next epoch, and its ring starts from the old one's measured
//     bandwidth. The first boundary of every view checks the state.
//
// Ring order. Every new view of 4 or more members probes its links (4 MiB
// each way per pair, on the probe channel; again every 1000 iterations),
// allgathers the speeds, and runs its data ring in the order
// ring.ChooseOrder picks from them, the same on every member: the one
// that crosses slow links least. Ranks keep their meaning; View.RingOrder
// gives the order. Config.RingOrder RingOrderFixed keeps address order.
//
// A worker left in an older epoch fails with ring.ErrStaleEpoch at its
// first exchange with the newer view, and does not mix its data with it.
// Shares. With Config.Balance BalanceLBBSP (the default) every worker fits
// its own compute time per sample from its iterations (package balance)
// and sends the model in its boundary record; every worker then derives
// the same next shares from the table, moving samples from slow workers to
// fast ones, damped, while the global batch stays exact. BalanceStatic
// keeps equal shares, or Config.Shares. A new view (a join, a leave or a
// recovery) starts from the shares the members' fitted models give, a
// joiner taking an equal share, and from equal shares under
// BalanceStatic. With Config.BytesPerSample, a worker's share is capped at its
// device's memory headroom over it (WithDevice; the GPU at LocalRank by
// default), from a view's first iteration on.
//
// Recovery from a lost worker comes next; until then a failed collective
// is an error.
//
// Library code here never reads flags or the environment itself: main
// packages read them and pass them in through Config.
package gyre
