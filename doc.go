// Package gyre is the embedding API of Gyre, a collective-communication
// runtime for data-parallel training with no parameter server.
//
// A trainer fills a Config (ConfigFromEnv reads the GYRE_* variables that
// `gyre launch` sets; BindFlags and BindPFlags add the usual flags), hands
// its state to Join, and loops over iterations on the Worker it gets back.
// Join connects the workers, checks that they registered the same state
// and batch settings, and broadcasts rank 0's state, so every worker
// starts identical.
//
// # The iteration loop
//
// This is the loop every trainer follows. It stays correct when the view
// or the shares change between iterations, because the Worker, not the
// trainer, owns the iteration number, the sampler and the committed state:
//
//	state := gyre.NewState().Float64("w1", w1).Float64("w2", w2).Float64("m1", m1) // params, optimizer buffers
//	w, err := gyre.Join(ctx, cfg, gyre.WithState(state))
//	if err != nil { ... }
//	defer w.Close()
//	for w.Iter() < iters {
//		b := w.Batch()                                // this worker's sample indices
//		loss := model.Forward(b.Indices)
//		model.Backward(func(name string, grad []float64) {
//			w.AllReduceAsync64(ctx, name, grad)       // local mean in, global mean out
//		})
//		if err := w.Wait(ctx); err != nil { ... }    // every gradient is now the global mean
//		opt.Step()
//		change, err := w.Boundary(ctx)                // agree on the next iteration
//		if err != nil { ... }
//		if change.Redo {
//			continue                                  // state was restored: run the iteration again
//		}
//		w.Commit()                                    // the point Restore returns to
//	}
//	w.Leave(ctx)
//
// Gradients. The trainer passes each tensor's mean over its own bᵢ
// samples, as soon as backward produces it; the Worker weights it by bᵢ/B
// and sums over workers, so the result is the sample-weighted global mean
// whatever the shares. Tensors are fused into buckets by submission order
// and size and sent while backward continues, as in PyTorch DDP.
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
// iteration, or the same error everywhere (an *IterationError naming the
// ranks whose collectives failed, ErrDiverged naming the ranks whose
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
// Config.CollectiveTimeout (10 minutes). A peer whose process stops
// answering heartbeats, which travel on a channel of their own, is
// declared gone after Config.PeerTimeout (2 s): killed, stopped or cut off.
//
// State. Commit copies the registered tensors, metadata and the iteration
// aside; Restore and Abandon copy them back, as Horovod's elastic state
// does. An error in the trainer's own code midway through an iteration is
// handled by Abandon, on every worker, and running the iteration again.
//
// The view. For now the view is static: Config.Peers lists every worker's
// data-plane address in rank order, as `gyre launch` or an MPI-style
// launcher passes it. Gossip membership, recovery from a lost worker and
// throughput-based shares will change views and shares at Boundary behind
// the same API; until then a failed collective is an error, and shares are
// equal or fixed by Config.Shares.
//
// Library code here never reads flags or the environment itself: main
// packages read them and pass them in through Config.
package gyre
