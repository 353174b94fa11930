package rlqstest

import (
	"sort"
	"strconv"
	"strings"
)

// bucketKeyString names an unordered bucket id.
func bucketKeyString(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(strconv.Quote(k) + "=" + strconv.Quote(id[k]) + ";")
	}
	return b.String()
}
