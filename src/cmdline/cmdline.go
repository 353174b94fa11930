// Package cmdline holds what the service's commands share on their command
// lines.
package cmdline

// HelpAsked reports whether args ask for help (-h, -help or --help before
// any "--"): a command then prints its usage to standard output and exits
// 0, where a flag error prints it to standard error.
func HelpAsked(args []string) bool {
	for _, a := range args {
		switch a {
		case "-h", "-help", "--help":
			return true
		case "--":
			return false
		}
	}
	return false
}
