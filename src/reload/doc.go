// Package reload is the served config's lifecycle around package config:
// the Holder every load installs into and the service reads (a failed load
// never replaces a good config), the Reloader that runs each load with the
// collector tightened and logs its outcome, the Watcher that reloads when
// the config directory's files change, and the loads' metrics.
package reload
