package tcp

import (
	"testing"

	"github.com/gyre-ml/gyre/transport/transporttest"
)

func TestConformanceTLS(t *testing.T) {
	transporttest.Run(t, newNodes(false, nil))
}

func TestConformanceInsecure(t *testing.T) {
	transporttest.Run(t, newNodes(true, nil))
}

func TestConformanceStriped(t *testing.T) {
	transporttest.Run(t, newNodes(false, func(c *Config) { c.Stripes = 3 }))
}
