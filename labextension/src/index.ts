/**
 * hami-jupyter's JupyterLab extension: the GPU slice of the current notebook's
 * kernel in the status bar, and a right-side panel with the slice's kernels.
 * Data: the server extension's `GET {baseUrl}hami/v1/kernels/<id>`; kernel
 * actions: the standard Jupyter kernels API, and the server extension's park
 * and resume (the panel calls those itself, src/api.ts).
 */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  ISessionContext,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { KernelAPI } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { kernelName, normalizeRefreshRate } from './format';
import { normalizeHistoryMinutes } from './history';
import { gpuIcon } from './icon';
import { SliceModel } from './model';
import { KernelAction, PANEL_ID, SlicePanel } from './panel';
import { SliceStatusItem } from './statusbar';
import { ISliceKernel } from './types';

/** The plugin, and the id of its settings (schema/plugin.json). */
export const PLUGIN_ID = 'hami-jupyter-labextension:plugin';

export namespace CommandIDs {
  /** Opens (and focuses) the slice panel. */
  export const openSlicePanel = 'hami:open-slice-panel';
}

/** The session context of a widget that has a kernel (a notebook, a console), else null. */
function sessionContextOf(widget: Widget | null): ISessionContext | null {
  const context = (widget as { sessionContext?: unknown } | null)?.sessionContext;
  if (typeof context === 'object' && context !== null && 'kernelChanged' in context) {
    return context as ISessionContext;
  }
  return null;
}

/**
 * Follows the current notebook's kernel into the model. A widget without a
 * kernel (an editor, the launcher) leaves the last notebook's kernel shown,
 * until that notebook is closed.
 */
class KernelFollower {
  constructor(private readonly _model: SliceModel) {}

  follow(widget: Widget | null): void {
    const context = sessionContextOf(widget);
    if (context !== null) {
      this._track(context);
    }
  }

  private _track(context: ISessionContext | null): void {
    if (context === this._context) {
      return;
    }
    if (this._context !== null) {
      this._context.kernelChanged.disconnect(this._update, this);
      this._context.sessionChanged.disconnect(this._update, this);
      this._context.disposed.disconnect(this._onDisposed, this);
    }
    this._context = context;
    if (context !== null) {
      context.kernelChanged.connect(this._update, this);
      context.sessionChanged.connect(this._update, this);
      context.disposed.connect(this._onDisposed, this);
    }
    this._update();
  }

  private _update(): void {
    this._model.kernelId = this._context?.session?.kernel?.id ?? null;
  }

  private _onDisposed(): void {
    this._track(null);
  }

  private _context: ISessionContext | null = null;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: "The GPU slice of the current notebook's kernel: status bar item and side panel",
  autoStart: true,
  optional: [IStatusBar, ISettingRegistry, ILayoutRestorer, ICommandPalette, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    labShell: ILabShell | null
  ): void => {
    const serverSettings = app.serviceManager.serverSettings;
    const model = new SliceModel({ serverSettings });

    const panel = new SlicePanel({
      model,
      onAction: (kernel, action) => runKernelAction(app, kernel, action),
      onShow: () => requestAnimationFrame(() => makeRoom(labShell))
    });

    app.commands.addCommand(CommandIDs.openSlicePanel, {
      label: 'Show GPU Slice Panel',
      caption: "The current notebook's GPU slice and its kernels",
      icon: gpuIcon,
      execute: () => {
        if (!panel.isAttached) {
          app.shell.add(panel, 'right', { rank: 900 });
        }
        app.shell.activateById(panel.id);
      }
    });
    palette?.addItem({ command: CommandIDs.openSlicePanel, category: 'GPU' });

    app.shell.add(panel, 'right', { rank: 900 });
    restorer?.add(panel, PANEL_ID);

    if (statusBar) {
      const item = new SliceStatusItem({
        model,
        onClick: () => void app.commands.execute(CommandIDs.openSlicePanel)
      });
      statusBar.registerStatusItem(`${PLUGIN_ID}:status`, {
        item,
        align: 'left',
        rank: 50,
        // Above 0: the status bar hides priority-0 items in a window under 630 px,
        // and this item is where a narrow-screen user sees the cap.
        priority: 2,
        isActive: () => model.inSlice,
        activeStateChanged: model.changed
      });
    }

    const follower = new KernelFollower(model);
    const shell = labShell ?? app.shell;
    shell.currentChanged?.connect((_, args) => follower.follow(args.newValue));
    follower.follow(shell.currentWidget);

    if (settingRegistry) {
      // The memory thresholds are no setting: the server sends them with each status.
      const apply = (settings: ISettingRegistry.ISettings): void => {
        model.refreshRate = normalizeRefreshRate(settings.get('refreshRate').composite);
        model.historyMinutes = normalizeHistoryMinutes(settings.get('historyMinutes').composite);
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason => {
          console.error(`hami-jupyter: cannot load the settings of ${PLUGIN_ID}`, reason);
        });
    }
  }
};

/**
 * In a window too narrow for both side areas and the panel (a phone, 320 to
 * 600 px), the left one (the file browser) closes when the panel opens, as a
 * narrow screen shows one side panel at a time: otherwise the page grows
 * wider than the window, and the right tab bar, whose tab closes the panel,
 * lies off-screen.
 */
function makeRoom(labShell: ILabShell | null): void {
  if (labShell && !labShell.leftCollapsed && document.documentElement.scrollWidth > window.innerWidth) {
    labShell.collapseLeft();
  }
}

/** Interrupts, restarts or shuts down a kernel of this server; the last two after asking. */
async function runKernelAction(
  app: JupyterFrontEnd,
  kernel: ISliceKernel,
  action: KernelAction
): Promise<void> {
  const id = kernel.kernel_id;
  const settings = app.serviceManager.serverSettings;
  const name = kernelName(kernel) + (kernel.kernelspec ? ` (${kernel.kernelspec})` : '');
  try {
    if (action === 'interrupt') {
      await KernelAPI.interruptKernel(id, settings);
      return;
    }
    const verb = action === 'restart' ? 'Restart' : 'Shut Down';
    const consequence =
      action === 'restart'
        ? 'Its variables are lost and its GPU memory goes back to the slice.'
        : 'Its variables are lost, its GPU memory goes back to the slice, and its notebook has no kernel until one is started.';
    const result = await showDialog({
      title: `${verb} kernel ${name}?`,
      body: consequence,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: verb })]
    });
    if (!result.button.accept) {
      return;
    }
    if (action === 'restart') {
      await KernelAPI.restartKernel(id, settings);
    } else {
      // Through the kernel manager, so the rest of JupyterLab learns of it at once.
      await app.serviceManager.kernels.shutdown(id);
    }
  } catch (reason) {
    await showErrorMessage(`Cannot ${action} kernel ${name}`, reason as Error);
  }
}

export default plugin;
