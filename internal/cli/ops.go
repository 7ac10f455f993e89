package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/tilefarm/tilefarm/internal/api"
)

// The coordinator's client commands for operating a farm: workers and dlq (gc is in gc.go).

func (p *program) workersCommand() *cobra.Command {
	c := newCommand("workers", "list the live workers", `
List the live workers from their heartbeats: name, host, tile slots, tiles rendering now,
samples per second, when last seen, the jobs each has blocklisted, and its pools: the tags its
operator gave it (tileworker --tags) and the renderer builds it runs. A job renders only on
workers with its build and every tag it requires. A worker that stops beating (killed, frozen,
cut off) leaves the list within 15 s.`)
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		ws, err := p.client().Workers(ctx)
		if err != nil {
			return err
		}
		if p.jsonOut {
			if ws == nil {
				ws = []api.Worker{}
			}
			return writeJSON(stdout, map[string]any{"workers": ws})
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKER\tHOST\tSLOTS\tTILES\tSAMPLES/S\tLAST SEEN\tBLOCKLISTED\tTAGS\tBUILDS")
		for _, w := range ws {
			var tiles []string
			for _, t := range w.Tiles {
				tiles = append(tiles, fmt.Sprintf("%s/%d %d/%d", short(t.JobID), t.Frame, t.SamplesDone, t.SamplesTotal))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.0f\t%s ago\t%s\t%s\t%s\n", w.Name, w.Host, w.Slots, orDash(strings.Join(tiles, ", ")),
				w.SamplesPerSecond, time.Since(w.LastSeen).Round(time.Second), orDash(strings.Join(w.Blocklisted, ", ")),
				orDash(strings.Join(w.Tags, ",")), orDash(strings.Join(w.Builds, "; ")))
		}
		return tw.Flush()
	})
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (p *program) dlqCommand() *cobra.Command {
	c := newCommand("dlq", "inspect and requeue dead-lettered tiles", "List dead-lettered tiles with their error, or put one back on the queue.")
	c.RunE = func(c *cobra.Command, pos []string) error {
		return usagef("want 'dlq list' or 'dlq requeue SEQ'")
	}
	list := newCommand("list", "list dead-lettered tiles", "List dead-lettered tiles: sequence, subject, message id, deliveries and the reason.")
	p.runErr(list, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		dls, err := p.client().DeadLetters(ctx)
		if err != nil {
			return err
		}
		if p.jsonOut {
			if dls == nil {
				dls = []api.DeadLetter{}
			}
			return writeJSON(stdout, dls)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tSUBJECT\tMSG ID\tDELIVERIES\tREASON")
		for _, d := range dls {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\n", d.DLQSeq, d.Subject, short(d.MsgID), d.Deliveries, strings.ReplaceAll(d.Reason, "\n", " "))
		}
		return tw.Flush()
	})
	requeue := newCommand("requeue SEQ", "put a dead-lettered tile back on the queue", "Put the dead letter SEQ (from 'dlq list') back on the queue, with its failure count reset.")
	p.runErr(requeue, exactArgs(1, "one SEQ"), func(ctx context.Context, pos []string, stdout, stderr io.Writer) error {
		seq, err := strconv.ParseUint(pos[0], 10, 64)
		if err != nil {
			return usagef("dlq requeue %q: want a sequence number from 'dlq list'", pos[0])
		}
		if err := p.client().Requeue(ctx, seq); err != nil {
			return err
		}
		if p.jsonOut {
			return writeJSON(stdout, map[string]any{"requeued": seq})
		}
		fmt.Fprintf(stdout, "requeued %d\n", seq)
		return nil
	})
	c.AddCommand(list, requeue)
	return c
}
