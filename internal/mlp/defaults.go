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

// Recipe is what a data set trains with unless told otherwise: the hidden
// layers, their activation, momentum SGD's settings, the global batch, the
// iteration budget and the test accuracy to stop at.
type Recipe struct {
	Hidden    []int
	Act       Activation
	LR, Mu    float64
	Batch     int
	Iters     int64
	TargetAcc float64
}

// Sizes returns the layer sizes of the recipe's model on data with the
// given input width.
func (r Recipe) Sizes(inputs int) []int {
	return append(append([]int{inputs}, r.Hidden...), NumClasses)
}

// SyntheticRecipe is the recipe of the synthetic Dataset: the Default
// constants and DefaultSizes.
func SyntheticRecipe() Recipe {
	return Recipe{Hidden: DefaultSizes()[1:2], Act: Tanh, LR: DefaultLR, Mu: DefaultMomentum,
		Batch: DefaultBatch, Iters: DefaultIters, TargetAcc: DefaultTargetAcc}
}

// MNISTRecipe is the recipe of MNIST (measurements in doc.go): 784→128→10
// with ReLU, SGD at 0.1 with momentum 0.9 on a global batch of 512,
// stopping at 97% test accuracy, which it passed at iteration 250 to 350
// (two to three epochs) for three seeds; the budget of 1000 leaves room.
// Batch 256 at 0.05 needed fewer samples but half again the iterations,
// so more synchronisation and more evaluations (every worker evaluates
// all 10,000 test images), and a hidden layer of 64 stalled near 97%.
func MNISTRecipe() Recipe {
	return Recipe{Hidden: []int{128}, Act: ReLU, LR: 0.1, Mu: DefaultMomentum,
		Batch: 512, Iters: 1000, TargetAcc: 0.97}
}
