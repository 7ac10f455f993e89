package render

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// decodeStrict decodes one JSON value into v, rejecting unknown fields and
// trailing data, and turns decoding errors into *SceneError naming field.
func decodeStrict(data []byte, v any, field string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(data, err, field)
	}
	if _, err := dec.Token(); err != io.EOF {
		line, col := lineCol(data, dec.InputOffset())
		return sceneErr(field, "malformed JSON: unexpected data after the value at line %d, column %d", line, col)
	}
	return nil
}

// jsonError converts an encoding/json error into a *SceneError.
func jsonError(data []byte, err error, field string) error {
	var syn *json.SyntaxError
	var ute *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line, col := lineCol(data, syn.Offset)
		return sceneErr(field, "malformed JSON at line %d, column %d: %s", line, col, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.As(err, &ute):
		f := joinField(field, ute.Field)
		if strings.HasPrefix(ute.Value, "number") && isNumberKind(ute.Type) {
			if k := ute.Type.Kind(); k == reflect.Float64 || k == reflect.Float32 {
				return sceneErr(f, "%s is out of range (NaN and Inf are rejected)", ute.Value)
			}
			return sceneErr(f, "%s is not %s in range", ute.Value, describeType(ute.Type))
		}
		return sceneErr(f, "got %s, want %s", ute.Value, describeType(ute.Type))
	case errors.Is(err, io.EOF):
		return sceneErr(field, "empty input, want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return sceneErr(field, "malformed JSON: unexpected end of input")
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if n, uerr := strconv.Unquote(name); uerr == nil {
			name = n
		}
		return sceneErr(joinField(field, name), "unknown field")
	}
	return sceneErr(field, "%v", err)
}

// lineCol converts a byte offset into 1-based line and column numbers.
func lineCol(data []byte, off int64) (int, int) {
	off = max(0, min(off, int64(len(data))))
	before := data[:off]
	line := bytes.Count(before, []byte{'\n'}) + 1
	col := len(before) - bytes.LastIndexByte(before, '\n')
	return line, col
}

func isNumberKind(t reflect.Type) bool {
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Float32, reflect.Float64, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32,
		reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// describeType names a Go type in scene-file terms.
func describeType(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Pointer:
		return describeType(t.Elem())
	}
	return fmt.Sprint(t)
}
