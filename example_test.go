package gyre_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// Two workers sharing a cluster secret exchange one message over QUIC.
func ExampleNewTransport() {
	key, _ := secret.Generate() // normally: Config.KeyFile from `gyre keygen`
	open := func(name string) transport.Transport {
		t, err := gyre.NewTransport(gyre.Config{Name: name, Key: key.Hex(), DataAddr: "127.0.0.1:0"})
		if err != nil {
			log.Fatal(err)
		}
		return t
	}
	a, b := open("a"), open("b")
	defer a.Close()
	defer b.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Connect(ctx, "b", b.(transport.Listener).Addr()); err != nil {
		log.Fatal(err)
	}
	if err := a.Send(ctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData, Seq: 1}, []byte("gradients")); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 64)
	h, n, err := b.Recv(ctx, "a", transport.ChanData, buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("seq %d: %s\n", h.Seq, buf[:n])
	// Output: seq 1: gradients
}
