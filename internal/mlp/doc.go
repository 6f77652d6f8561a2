// Package mlp is the model and synthetic data of Gyre's built-in training
// job, used by the examples, `gyre train` and the benchmarks.
//
// Dataset generates a deterministic classification task: sample i is a
// pure function of (seed, i), so each worker generates exactly the samples
// the sampler assigns it. Indices below TestStart are the training split,
// indices from TestStart upward the test split.
//
// Model is a multi-layer perceptron with softmax cross-entropy whose
// parameters and gradients are one flat tensor per layer. Backward hands
// each layer's mean gradient to a callback as soon as it is complete, last
// layer first, so a trainer can overlap the allreduce with the rest of the
// backward pass. SGD is momentum SGD whose buffers are exposed as state.
package mlp
