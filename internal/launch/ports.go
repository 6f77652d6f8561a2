package launch

import (
	"errors"
	"fmt"
	"net"
)

// FreePorts returns n distinct 127.0.0.1 addresses whose port is free for
// both TCP and UDP, so either transport can bind it. The ports are held
// until all are chosen, then released for the workers; another process
// could take one in between, as with any launcher that picks ports.
func FreePorts(n int) ([]string, error) {
	var held []func() error
	defer func() {
		for _, c := range held {
			_ = c() // the ports were only held to keep them free
		}
	}()
	addrs := make([]string, 0, n)
	for tries := 0; len(addrs) < n; tries++ {
		if tries > 10*n+10 {
			return nil, errors.New("launch: could not find free ports on 127.0.0.1")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("launch: pick a port: %w", err)
		}
		held = append(held, l.Close)
		addr := l.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue // taken for UDP; try another
		}
		held = append(held, u.Close)
		addrs = append(addrs, addr)
	}
	return addrs, nil
}
