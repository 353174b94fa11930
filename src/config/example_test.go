package config_test

import (
	"fmt"
	"os"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/openrls/ratelimit/src/config"
)

// A config file is parsed, built, and asked which limits a request's
// descriptors meet; the plan's hits are what a store counts.
func ExampleConfig_Plan() {
	f, err := config.Parse("example.yaml", []byte(`
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    value: vip
    rate_limit: {unlimited: true}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg, err := config.Build([]*config.File{f}, config.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	descs := []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "vip"}}},
	}
	p, err := cfg.Plan("shop", descs, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Release()
	for i, d := range p.Descs {
		fmt.Printf("descriptor %d: rule %s, %d hit(s), unlimited %v\n", i, d.Rule(), d.Count, d.Unlimited)
	}
	fmt.Println(p.Hits[0].Rule.Limit, p.Hits[0].Rule.Period)
	// Output:
	// descriptor 0: rule user, 1 hit(s), unlimited false
	// descriptor 1: rule user_vip, 0 hit(s), unlimited true
	// 10 1m0s
}

// Explain tells, counting nothing, how a config decides a request.
func ExampleConfig_Explain() {
	f, _ := config.Parse("example.yaml", []byte("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
	cfg, _ := config.Build([]*config.File{f}, config.Options{})
	d, _ := config.ParseDescriptor("user=alice")
	_ = cfg.Explain(os.Stdout, time.Now(), "shop", []*rlv3.RateLimitDescriptor{d})
	// Output:
	// descriptors[0] user=alice
	//   user=alice: key only, any value (example.yaml:3)
	//   rule: user (example.yaml:3)
	//   limit: 10 per minute, fixed_window  key {4:shop4:user5:alice}:fw60
}
