package gyre

import (
	"context"
	"errors"
	"testing"
)

func TestJoinRejectsBadConfig(t *testing.T) {
	_, err := Join(context.Background(), Config{Key: testKey(t), Shares: []int{3, 4}})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("Join = %v, want ErrConfig", err)
	}
	if _, err := Join(context.Background(), Config{Key: testKey(t)}, WithState(NewState().Float64("x", nil).Float64("x", nil))); !errors.Is(err, ErrConfig) {
		t.Fatalf("duplicate state: Join = %v, want ErrConfig", err)
	}
}
