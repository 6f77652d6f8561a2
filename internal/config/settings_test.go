package config

import "testing"

func TestSettingsDigestCoversEverySetting(t *testing.T) {
	base := DigestSettings(JobSettings(Config{}.WithDefaults(), nil))
	for _, c := range []Config{{GlobalBatch: 7}, {RNGSeed: 1}, {DatasetSize: 5}, {Balance: BalanceStatic},
		{BalanceAllowZero: true}, {RingOrder: RingOrderFixed}, {BucketBytes: 1024}, {Compress: "fp16"}, {Algo: AlgoRing}} {
		if DigestSettings(JobSettings(c.WithDefaults(), nil)) == base {
			t.Errorf("%+v: same digest as the defaults", c)
		}
	}
	if DigestSettings(JobSettings(Config{}.WithDefaults(), []int{1, 2})) == base {
		t.Error("static shares do not change the digest")
	}
}
