//go:build !race

package rlqs_test

const raceBuild = false
