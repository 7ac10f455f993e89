// Package api is the coordinator's HTTP API as it crosses the wire: the bodies of requests and
// responses with their typed states, and the one catalogue of errors, each with its HTTP status
// and the exit code the commands give it (docs/operations.md, "Exit codes"). The coordinator
// serves these types, the client sends and decodes them, the commands and the monitor show
// them. It imports nothing of the farm, so a client of the API links none of the server.
package api
