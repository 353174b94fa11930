package config

// ShapeEntry is one entry of a descriptor as a proxy config describes it:
// a key with either a fixed value or a value known only per request
// (Dynamic), such as a header or the client address.
type ShapeEntry struct {
	Key, Value string
	Dynamic    bool
}

// Reach returns the paths of the rules with limits that a descriptor of this
// shape can reach: a dynamic entry may meet any descriptor of its key at its
// level, a fixed one only the descriptor that would match it. The
// examples' tests use it to check the Envoy bootstraps' rate limit actions
// against the example config.
func (d *Domain) Reach(shape []ShapeEntry) []string {
	if d == nil || len(shape) == 0 {
		return nil
	}
	var out []string
	var walk func(lv *level, depth int)
	walk = func(lv *level, depth int) {
		e := shape[depth]
		var cands []*Node
		if e.Dynamic {
			for _, n := range lv.nodes() {
				if n.key == e.Key {
					cands = append(cands, n)
				}
			}
		} else if n := lv.find(e.Key, e.Value); n != nil {
			cands = []*Node{n}
		}
		for _, n := range cands {
			if depth == len(shape)-1 {
				if len(n.limits) > 0 {
					out = append(out, n.path)
				}
				continue
			}
			walk(&n.children, depth+1)
		}
	}
	walk(&d.root, 0)
	return out
}

// LimitPaths returns the paths of every rule with a limit in the domain.
func (d *Domain) LimitPaths() []string {
	var out []string
	d.visit(func(n *Node) {
		if len(n.limits) > 0 {
			out = append(out, n.path)
		}
	})
	return out
}

// LimitsAt returns the limits of the rule at path (a metric path, as Reach
// and LimitPaths return), or nil. For tools that check configs.
func (d *Domain) LimitsAt(path string) []*Limit {
	var found []*Limit
	d.visit(func(n *Node) {
		if n.path == path && found == nil {
			found = n.limits
		}
	})
	return found
}
