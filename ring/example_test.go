package ring

import "fmt"

// ExampleRingAllReduce prints rank 0's plan for an allreduce of 7 elements
// over 3 ranks in chunks of 2: two reduce-scatter steps, then two allgather
// steps, each send waiting for the receive of the same chunk one step
// earlier.
func ExampleRingAllReduce() {
	p, err := RingAllReduce(3, 0, 7, 2)
	if err != nil {
		panic(err)
	}
	fmt.Println("segments:", Segments(7, 3))
	for _, x := range p.Sends {
		fmt.Printf("send to %d  step %d chunk %d  [%d,%d)  after recv %d\n",
			x.Peer, x.Step, x.Chunk, x.Off, x.End(), x.After)
	}
	for _, x := range p.Recvs {
		fmt.Printf("recv from %d  step %d chunk %d  [%d,%d)  reduce=%v final=%v\n",
			x.Peer, x.Step, x.Chunk, x.Off, x.End(), x.Reduce, x.Final)
	}
	// Output:
	// segments: [{0 3} {3 2} {5 2}]
	// send to 1  step 0 chunk 0  [0,2)  after recv -1
	// send to 1  step 0 chunk 1  [2,3)  after recv -1
	// send to 1  step 1 chunk 0  [5,7)  after recv 0
	// send to 1  step 2 chunk 0  [3,5)  after recv 1
	// send to 1  step 3 chunk 0  [0,2)  after recv 2
	// send to 1  step 3 chunk 1  [2,3)  after recv 3
	// recv from 2  step 0 chunk 0  [5,7)  reduce=true final=false
	// recv from 2  step 1 chunk 0  [3,5)  reduce=true final=true
	// recv from 2  step 2 chunk 0  [0,2)  reduce=false final=false
	// recv from 2  step 2 chunk 1  [2,3)  reduce=false final=false
	// recv from 2  step 3 chunk 0  [5,7)  reduce=false final=false
}
