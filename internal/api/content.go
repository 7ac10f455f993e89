package api

// ContentRef names one file of a scene by its content: what a client asks the farm about
// before it uploads (POST /v1/content/missing) and what it uploads under
// (PUT /v1/content/{sha256}, the body Size bytes).
type ContentRef struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// MaxContentAsked is the most files one POST /v1/content/missing asks about: a client asks in
// batches of this many.
const MaxContentAsked = 10_000

// MissingContentRequest asks which files the farm lacks.
type MissingContentRequest struct {
	Files []ContentRef `json:"files"`
}

// MissingContentResult names the files of a MissingContentRequest the farm lacks.
type MissingContentResult struct {
	Missing []ContentRef `json:"missing"`
}

// ContentType of a scene manifest (PUT /v1/scenes/{version}) and of a file's content.
const (
	ManifestType    = "application/vnd.tilefarm.manifest+json"
	ContentDataType = "application/octet-stream"
)
