package farmbench

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// minioRequestsLine is one sample of MinIO's count of S3 requests by API, as its Prometheus
// endpoint writes it: minio_s3_requests_total{api="putobject",server="..."} 42.
var minioRequestsLine = regexp.MustCompile(`^minio_s3_requests_total\{(?:[^}]*,)?api="([^"]+)"[^}]*\}\s+(\S+)`)

// MinIORequests reads the S3 requests MinIO at endpoint (host:port) has served so far, by API
// (getobject, putobject, headobject, listobjectsv2, ...), from its own counters: the server
// must run with MINIO_PROMETHEUS_AUTH_TYPE=public (miniotest starts it so).
func MinIORequests(ctx context.Context, endpoint string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/minio/v2/metrics/cluster", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading MinIO's request counters: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading MinIO's request counters: %s (is MINIO_PROMETHEUS_AUTH_TYPE=public set?)", resp.Status)
	}
	by := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := minioRequestsLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("reading MinIO's request counters: %q: %w", sc.Text(), err)
		}
		by[strings.ToLower(m[1])] += v
	}
	return by, sc.Err()
}

// minioMetricsCache is how long MinIO serves its counters from a cache (measured: about 10 s).
const minioMetricsCache = 11 * time.Second

// SettledMinIORequests is MinIORequests once MinIO's cache of its counters is fresh: it reads
// until the counters change (the cache was refreshed), or for as long as the cache lives. Call
// it while the farm makes no requests (before a job, after it), so the counters hold still.
func SettledMinIORequests(ctx context.Context, endpoint string) (map[string]float64, error) {
	first, err := MinIORequests(ctx, endpoint)
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(minioMetricsCache); time.Now().Before(deadline); {
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return nil, err
		}
		now, err := MinIORequests(ctx, endpoint)
		if err != nil {
			return nil, err
		}
		if !maps.Equal(now, first) {
			return now, nil
		}
	}
	return first, nil
}

// StoreRequests is SettledMinIORequests of the farm's MinIO; nil on the coordinator's file store.
func (f *Farm) StoreRequests(ctx context.Context) (map[string]float64, error) {
	if f.minio == nil {
		return nil, nil
	}
	return SettledMinIORequests(ctx, f.minio.Endpoint)
}

// requestsPerTile is the requests between two readings of MinIORequests per tile: in all, and
// by API.
func requestsPerTile(before, after map[string]float64, tiles int) (float64, map[string]float64) {
	if tiles == 0 {
		return 0, nil
	}
	by := map[string]float64{}
	total := 0.0
	for api, n := range after {
		if d := n - before[api]; d > 0 {
			by[api] = d / float64(tiles)
			total += d
		}
	}
	return total / float64(tiles), by
}
