package linkbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/transport"
)

// TransportFactory builds a listening Gyre transport from a Config, as
// gyre.NewTransport does; tests substitute in-process transports. The
// transport must implement transport.Listener.
type TransportFactory func(gyre.Config) (transport.Transport, error)

// connectTimeout bounds a Connect or a dial, and the peer's start.
const connectTimeout = 30 * time.Second

// Names of the peer command's flags, which PeerSpec.Args writes.
const (
	FlagLink     = "link"
	FlagBare     = "bare"
	FlagDeadline = "deadline"
)

// PeerSpec is what the parent tells the peer through its flags.
type PeerSpec struct {
	// Links maps a link ("quic/2": variant and stripes) to the parent's
	// address for it. The peer builds the same transport and connects back.
	Links map[string]string
	// Bare lists the baselines the peer listens for.
	Bare []BareKind
	// Deadline is how long the peer may live, however the parent fares.
	Deadline time.Duration
}

// Args returns the spec as flags of the peer command.
func (s PeerSpec) Args() []string {
	var args []string
	for _, k := range slices.Sorted(maps.Keys(s.Links)) {
		args = append(args, "--"+FlagLink, k+"="+s.Links[k])
	}
	for _, b := range s.Bare {
		args = append(args, "--"+FlagBare, string(b))
	}
	return append(args, "--"+FlagDeadline, s.Deadline.String())
}

// PeerOptions configure ServePeer.
type PeerOptions struct {
	Links        map[string]string // as in PeerSpec
	Bare         []string          // baseline names, as in PeerSpec
	Key          secret.Secret     // the secret the parent passed in
	NewTransport TransportFactory  // default gyre.NewTransport
	Logger       zerolog.Logger
}

// PeerHello is the one JSON line the peer prints on stdout once every
// link is connected and every baseline listens.
type PeerHello struct {
	Links map[string]string   `json:"links"` // link -> the peer's address
	Bare  map[BareKind]string `json:"bare"`  // baseline -> the peer's address
}

// ServePeer runs the peer side of the transport benchmark. It builds and
// connects the Gyre links, listens for the baselines, prints a PeerHello
// line to stdout and answers the parent's commands until stdin closes
// (the parent is done or gone) or ctx ends. It returns nil after a clean
// stop on stdin; the caller bounds ctx with the spec's deadline.
func ServePeer(ctx context.Context, o PeerOptions, stdin io.Reader, stdout io.Writer) error {
	if o.Key.IsZero() {
		return errors.New("bench: the peer needs the cluster secret (GYRE_KEY)")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stdinDone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin) // until the parent closes it
		close(stdinDone)
		cancel()
	}()

	type namedLink struct {
		key string
		t   transport.Transport
	}
	var (
		links   []namedLink
		bares   []bareListener
		cleanup sync.Once
	)
	closeAll := func() {
		cleanup.Do(func() {
			for _, l := range links {
				l.t.Close()
			}
			for _, l := range bares {
				l.close()
			}
		})
	}
	defer closeAll()

	hello := PeerHello{Links: map[string]string{}, Bare: map[BareKind]string{}}
	for _, key := range slices.Sorted(maps.Keys(o.Links)) {
		t, addr, err := openLink(ctx, o.NewTransport, key, peerID, o.Key, o.Logger)
		if err != nil {
			return err
		}
		links = append(links, namedLink{key, t})
		cctx, ccancel := context.WithTimeout(ctx, connectTimeout)
		err = t.Connect(cctx, parentID, o.Links[key])
		ccancel()
		if err != nil {
			return fmt.Errorf("bench: link %s: connect to the parent at %s: %w", key, o.Links[key], err)
		}
		hello.Links[key] = addr
	}
	var id *secret.Identity
	for _, name := range o.Bare {
		kind, err := parseBareKind(name)
		if err != nil {
			return err
		}
		if id == nil && kind != BareTCP {
			if id, err = identity(o.Key, peerID); err != nil {
				return err
			}
		}
		l, err := listenBare(kind, id)
		if err != nil {
			return err
		}
		bares = append(bares, l)
		hello.Bare[kind] = l.addr()
	}
	line, err := json.Marshal(hello)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "%s\n", line); err != nil {
		return fmt.Errorf("bench: write hello: %w", err)
	}

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	for _, l := range links {
		wg.Go(func() {
			if err := serveLink(ctx, l.t); err != nil {
				fail(fmt.Errorf("bench: link %s: %w", l.key, err))
			}
		})
	}
	for _, l := range bares {
		wg.Go(func() {
			for {
				open, err := l.accept(ctx)
				if err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("bench: bare accept: %w", err))
					}
					return
				}
				wg.Go(func() {
					octx, ocancel := context.WithTimeout(ctx, connectTimeout)
					c, err := open(octx)
					ocancel()
					if err != nil {
						// A client that fails its handshake is refused, not fatal.
						o.Logger.Warn().Err(err).Str("bare", l.addr()).Msg("bench peer: refused a connection")
						return
					}
					if err := serveBare(ctx, c); err != nil && ctx.Err() == nil {
						fail(fmt.Errorf("bench: bare %s: %w", l.addr(), err))
					}
				})
			}
		})
	}
	<-ctx.Done()
	closeAll()
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	select {
	case <-stdinDone:
		return nil
	default:
		return fmt.Errorf("bench: peer stopped before the parent was done: %w", context.Cause(ctx))
	}
}

// openLink builds one listening Gyre transport for key ("quic/2").
func openLink(ctx context.Context, newTransport TransportFactory, key string, name transport.PeerID, s secret.Secret, log zerolog.Logger) (transport.Transport, string, error) {
	v, stripes, err := parseLinkKey(key)
	if err != nil {
		return nil, "", err
	}
	if newTransport == nil {
		newTransport = gyre.NewTransport
	}
	cfg := gyre.Config{
		Name:      string(name),
		Transport: v.Transport,
		Insecure:  v.Insecure,
		Stripes:   stripes,
		Key:       s.Hex(),
		Listen:    "127.0.0.1:0",
		DataAddr:  "127.0.0.1:0",
		Logger:    new(log.With().Str("link", key).Logger()),
	}
	t, err := newTransport(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("bench: link %s: %w", key, err)
	}
	l, ok := t.(transport.Listener)
	if !ok {
		t.Close()
		return nil, "", fmt.Errorf("bench: link %s: %T does not listen", key, t)
	}
	return t, l.Addr(), nil
}

// identity mints a leaf certificate for name from the cluster secret, for
// the bare TLS and QUIC baselines.
func identity(s secret.Secret, name transport.PeerID) (*secret.Identity, error) {
	ca, err := s.CA()
	if err != nil {
		return nil, err
	}
	return ca.Issue(string(name))
}

// parseHello reads the peer's hello line.
func parseHello(line string) (PeerHello, error) {
	var h PeerHello
	if err := json.Unmarshal([]byte(strings.TrimSpace(line)), &h); err != nil {
		return h, fmt.Errorf("%w: bad hello line %q: %v", ErrProtocol, line, err)
	}
	return h, nil
}
