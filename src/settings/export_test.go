package settings

// EachVar lets the external tests walk the variables as Names does.
var EachVar = eachVar
