package mlp

// The training recipe tuned for the default Dataset (measurements and the
// commands that reproduce them are in doc.go). Trainers, the examples and
// `gyre train` use these so that every run trains the same job.
const (
	// DefaultLR is the SGD learning rate, constant over the run.
	DefaultLR = 0.1
	// DefaultMomentum is the SGD momentum coefficient.
	DefaultMomentum = 0.9
	// DefaultBatch is the global batch size: the sum of the workers'
	// shares, over which the allreduced gradient is the mean.
	DefaultBatch = 256
	// DefaultIters is the recommended iteration budget. The default model
	// passes 95% test accuracy near iteration 750 and is near 99% here.
	DefaultIters = 1500
	// DefaultTargetAcc is the accuracy the task is tuned to reach.
	DefaultTargetAcc = 0.95
	// DefaultTestSize is the number of test samples evaluation uses: the
	// indices TestStart to TestStart+DefaultTestSize−1.
	DefaultTestSize = 10000
)

// DefaultSizes returns the layer sizes of the default MLP: InputDim inputs,
// one tanh hidden layer of 128 units, NumClasses outputs. One hidden layer
// trained fastest here; two layers of 64 or 128 needed a smaller learning
// rate and two to three times the iterations to reach 95%.
func DefaultSizes() []int { return []int{InputDim, 128, NumClasses} }

// NewDefault returns the default MLP with weights drawn from seed.
func NewDefault(seed uint64) *Model {
	m, err := New(DefaultSizes(), seed)
	if err != nil {
		panic(err) // unreachable: the sizes are constants
	}
	return m
}

// NewDefaultSGD returns the default optimizer for m.
func NewDefaultSGD(m *Model) *SGD { return NewSGD(m.Params(), DefaultLR, DefaultMomentum) }
