package recovery

import (
	"encoding/json"
	"errors"
	"fmt"
)

// codecVersion is the encoding's version: a rank refuses messages of
// another, rather than guess at their fields.
const codecVersion = 1

// wireMsg tags a message with its kind and the encoding's version.
type wireMsg struct {
	Version int             `json:"v"`
	Kind    string          `json:"kind"`
	Msg     json.RawMessage `json:"msg"`
}

// ErrBadMessage is matched by every Decode error.
var ErrBadMessage = errors.New("recovery: bad message")

// Encode turns m into bytes for the wire. Recovery messages are rare and
// small, so JSON costs nothing that matters and reads well in a capture.
func Encode(m Msg) ([]byte, error) {
	var kind string
	switch m.(type) {
	case Report:
		kind = "report"
	case Propose:
		kind = "propose"
	case Accept:
		kind = "accept"
	case Install:
		kind = "install"
	default:
		return nil, fmt.Errorf("recovery: cannot encode %T", m)
	}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.Marshal(wireMsg{Version: codecVersion, Kind: kind, Msg: body})
}

// Decode reads a message Encode wrote. Whatever else it is given, it
// returns an error matching ErrBadMessage.
func Decode(b []byte) (Msg, error) {
	var e wireMsg
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if e.Version != codecVersion {
		return nil, fmt.Errorf("%w: version %d, this rank reads %d", ErrBadMessage, e.Version, codecVersion)
	}
	var (
		m   Msg
		err error
	)
	switch e.Kind {
	case "report":
		m, err = decodeAs[Report](e.Msg)
	case "propose":
		m, err = decodeAs[Propose](e.Msg)
	case "accept":
		m, err = decodeAs[Accept](e.Msg)
	case "install":
		m, err = decodeAs[Install](e.Msg)
	default:
		return nil, fmt.Errorf("%w: unknown kind %q", ErrBadMessage, e.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadMessage, e.Kind, err)
	}
	return m, nil
}

// decodeAs unmarshals b as one message type.
func decodeAs[M Msg](b []byte) (Msg, error) {
	var m M
	err := json.Unmarshal(b, &m)
	return m, err
}
