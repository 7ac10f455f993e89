package coordinator

import (
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// The coordinator database's typed states under the names the API gives them: the database
// keeps them as numbers, the API as the same names (TestAPIStatesAreTheDatabases).

func apiJobState(s coorddb.JobState) api.JobState       { return api.JobState(s.String()) }
func apiFrameState(s coorddb.FrameState) api.FrameState { return api.FrameState(s.String()) }
func apiTileState(s coorddb.TileState) api.TileState    { return api.TileState(s.String()) }
