package config

import "testing"

func TestSettingsDigestCoversEverySetting(t *testing.T) {
	base := DigestSettings(JobSettings(Config{}.WithDefaults(), nil))
	for _, c := range []Config{{GlobalBatch: 7}, {RNGSeed: 1}, {DatasetSize: 5}, {Balance: BalanceStatic},
		{BalanceAllowZero: true}, {RingOrder: RingOrderFixed}, {BucketBytes: 1024}, {Compress: "fp16"}, {Algo: AlgoRing}, {Stripes: 2}} {
		if DigestSettings(JobSettings(c.WithDefaults(), nil)) == base {
			t.Errorf("%+v: same digest as the defaults", c)
		}
	}
	// Pinned counts may differ: the receiver follows each sender's.
	if DigestSettings(JobSettings(Config{Stripes: 2}, nil)) != DigestSettings(JobSettings(Config{Stripes: 4}, nil)) {
		t.Error("two pinned stripe counts give two digests")
	}
	if DigestSettings(JobSettings(Config{}.WithDefaults(), []int{1, 2})) == base {
		t.Error("static shares do not change the digest")
	}
}
